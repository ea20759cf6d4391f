//! A read-only directory tree of virtual files with stable inode numbers (root is 1).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::vfile::VirtualFile;

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// Content generated at each read (status files); not part of a view's files.
pub type DynamicContent = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

pub enum NodeKind {
    Dir { children: BTreeMap<String, Ino> },
    File(Arc<VirtualFile>),
    Dynamic(DynamicContent),
}

impl std::fmt::Debug for NodeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeKind::Dir { children } => f.debug_struct("Dir").field("children", children).finish(),
            NodeKind::File(v) => f.debug_tuple("File").field(v).finish(),
            NodeKind::Dynamic(_) => f.write_str("Dynamic"),
        }
    }
}

#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub parent: Ino,
    pub kind: NodeKind,
}

#[derive(Debug)]
pub struct Tree {
    nodes: Vec<Node>,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

impl Tree {
    pub fn new() -> Self {
        Tree { nodes: vec![Node { name: String::new(), parent: ROOT_INO, kind: NodeKind::Dir { children: BTreeMap::new() } }] }
    }

    pub fn get(&self, ino: Ino) -> Option<&Node> {
        ino.checked_sub(1).and_then(|i| self.nodes.get(i as usize))
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        match &self.get(parent)?.kind {
            NodeKind::Dir { children } => children.get(name).copied(),
            _ => None,
        }
    }

    /// Look up a `/`-separated path relative to the root.
    pub fn resolve(&self, path: &str) -> Option<Ino> {
        path.split('/').filter(|p| !p.is_empty()).try_fold(ROOT_INO, |ino, part| self.lookup(ino, part))
    }

    fn add(&mut self, parent: Ino, name: &str, kind: NodeKind) -> Ino {
        assert!(!name.is_empty() && !name.contains('/') && name != "." && name != "..", "bad name {name:?}");
        let ino = self.nodes.len() as Ino + 1;
        match &mut self.nodes[(parent - 1) as usize].kind {
            NodeKind::Dir { children } => {
                assert!(children.insert(name.to_string(), ino).is_none(), "duplicate name {name:?}");
            }
            _ => panic!("parent {parent} is not a directory"),
        }
        self.nodes.push(Node { name: name.to_string(), parent, kind });
        ino
    }

    pub fn add_dir(&mut self, parent: Ino, name: &str) -> Ino {
        self.add(parent, name, NodeKind::Dir { children: BTreeMap::new() })
    }

    pub fn add_file(&mut self, parent: Ino, name: &str, file: VirtualFile) -> Ino {
        self.add(parent, name, NodeKind::File(Arc::new(file)))
    }

    pub fn add_dynamic(&mut self, parent: Ino, name: &str, content: DynamicContent) -> Ino {
        self.add(parent, name, NodeKind::Dynamic(content))
    }

    pub fn add_file_arc(&mut self, parent: Ino, name: &str, file: Arc<VirtualFile>) -> Ino {
        self.add(parent, name, NodeKind::File(file))
    }

    /// Every file, in no particular order and without building paths (counts, sizes).
    pub fn vfiles(&self) -> impl Iterator<Item = &Arc<VirtualFile>> {
        self.nodes.iter().filter_map(|n| match &n.kind {
            NodeKind::File(f) => Some(f),
            _ => None,
        })
    }

    /// Every file with its path relative to the root, depth first in name order.
    pub fn files(&self) -> Vec<(String, Arc<VirtualFile>)> {
        let mut out = Vec::new();
        self.walk(ROOT_INO, String::new(), &mut out);
        out
    }

    fn walk(&self, ino: Ino, prefix: String, out: &mut Vec<(String, Arc<VirtualFile>)>) {
        if let Some(Node { kind: NodeKind::Dir { children }, .. }) = self.get(ino) {
            for (name, &child) in children {
                let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
                match &self.get(child).unwrap().kind {
                    NodeKind::File(f) => out.push((path, f.clone())),
                    NodeKind::Dir { .. } => self.walk(child, path, out),
                    NodeKind::Dynamic(_) => {}
                }
            }
        }
    }
}
