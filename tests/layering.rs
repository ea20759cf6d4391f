//! The layering the README's Layout section states, checked on the sources: each layer
//! imports only the layers below it (`util` -> `codec` -> `source` -> `digest` -> `store` ->
//! `view` -> `serve` | `materialize` -> `cli`), and `serve` and `materialize` know nothing
//! of each other. A path naming a higher layer (`crate::view` inside `src/store/`, in code or
//! in a doc link) fails the test with the file and line.

use std::path::{Path, PathBuf};

/// The layers, lowest first, each with the layers it may not name.
fn forbidden(layer: &str) -> &'static [&'static str] {
    match layer {
        "util" => &["codec", "source", "digest", "store", "view", "serve", "materialize", "cli"],
        "codec" => &["source", "digest", "store", "view", "serve", "materialize", "cli"],
        "source" => &["digest", "store", "view", "serve", "materialize", "cli"],
        "digest" => &["store", "view", "serve", "materialize", "cli"],
        "store" => &["view", "serve", "materialize", "cli"],
        "view" => &["serve", "materialize", "cli"],
        "serve" => &["materialize", "cli"],
        "materialize" => &["serve", "cli"],
        _ => &[],
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn layers_import_downwards_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    let mut checked = 0;
    for layer in ["util", "codec", "source", "digest", "store", "view", "serve", "materialize"] {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "src/{layer}/ has no sources");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // From the layer's own mod.rs, `super::` is the crate root.
            let top = file.parent() == Some(&src.join(layer)) && file.file_name().is_some_and(|n| n == "mod.rs");
            for (no, line) in text.lines().enumerate() {
                for higher in forbidden(layer) {
                    let names = |prefix: &str| {
                        line.match_indices(&format!("{prefix}{higher}"))
                            .any(|(at, m)| !line[at + m.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'))
                    };
                    if names("crate::") || (top && names("super::")) {
                        broken.push(format!("{}:{}: src/{layer} names {higher}: {}", file.display(), no + 1, line.trim()));
                    }
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} files checked");
    assert!(broken.is_empty(), "imports against the layering:\n{}", broken.join("\n"));
}
