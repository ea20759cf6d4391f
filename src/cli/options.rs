//! `-o key[=value],...` (fstab, `mount -t fuse.xpackfs`, systemd units) mapped onto the
//! same clap-derived options as the `--key value` flags, the way awslabs/mountpoint-s3 turns
//! fstab options into its `CliArgs`: each item becomes `--key=value` (or `--key` for a
//! switch) before clap parses the command line, so both forms share one declaration, one
//! set of value parsers and one set of messages. Generic mount options that mean nothing to
//! a read-only virtual filesystem are accepted and ignored, so fstab lines work.

use std::collections::HashMap;
use std::ffi::OsString;

/// Generic options accepted and ignored (besides `x-*` and `comment=*`).
const IGNORED: &[&str] = &[
    "rw",
    "ro",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "async",
    "sync",
    "dirsync",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "defaults",
    "_netdev",
    "nofail",
    "default_permissions",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
    "nosymfollow",
    "symfollow",
];

/// The long options of `cmd` (`-o` keys with dashes as underscores), and whether each takes a
/// value.
pub fn keys_of(cmd: &clap::Command) -> HashMap<String, bool> {
    cmd.get_arguments().filter_map(|a| Some((a.get_long()?.replace('-', "_"), a.get_action().takes_values()))).collect()
}

/// One `-o` list as flags for `keys`.
pub fn expand_list(list: &str, keys: &HashMap<String, bool>) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in list.split(',').filter(|s| !s.is_empty()) {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        let key = key.replace('-', "_");
        if key.starts_with("x-") || key.starts_with("x_") || key == "comment" || IGNORED.contains(&key.as_str()) {
            continue;
        }
        let flag = key.replace('_', "-");
        match (keys.get(&key), value) {
            (None, _) => return Err(format!("unknown option {key:?}; see `xpackfs mount --help`")),
            (Some(true), Some(v)) => out.push(format!("--{flag}={v}")),
            (Some(true), None) => return Err(format!("option {key} needs a value ({key}=...)")),
            (Some(false), None) => out.push(format!("--{flag}")),
            (Some(false), Some(_)) => return Err(format!("option {key} takes no value")),
        }
    }
    Ok(out)
}

/// Replace every `-o LIST` / `-oLIST` in `args` (after the subcommand at `from`) by the
/// flags it stands for.
pub fn expand(args: Vec<OsString>, from: usize, keys: &HashMap<String, bool>) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = Vec::with_capacity(args.len());
    let mut it = args.into_iter().enumerate();
    while let Some((i, a)) = it.next() {
        if i < from {
            out.push(a);
            continue;
        }
        let list = match a.to_str() {
            Some("-o") => match it.next() {
                Some((_, v)) => v.into_string().map_err(|_| "-o: options must be UTF-8".to_string())?,
                None => return Err("-o needs a comma-separated option list".into()),
            },
            Some(s) if s.starts_with("-o") && !s.starts_with("--") => s[2..].to_string(),
            Some("--") => {
                out.push(a);
                out.extend(it.map(|(_, a)| a));
                break;
            }
            _ => {
                out.push(a);
                continue;
            }
        };
        out.extend(expand_list(&list, keys)?.into_iter().map(OsString::from));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> HashMap<String, bool> {
        [("top_k", true), ("allow_other", false), ("alignment", true), ("debug", false)].into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn fstab_style_lists() {
        let k = keys();
        assert_eq!(
            expand_list("rw,nodev,nosuid,_netdev,x-systemd.automount,comment=x,top_k=4,alignment=65536,allow_other,debug", &k).unwrap(),
            ["--top-k=4", "--alignment=65536", "--allow-other", "--debug"]
        );
        assert!(expand_list("bogus=1", &k).unwrap_err().contains("bogus"));
        assert!(expand_list("top_k", &k).unwrap_err().contains("needs a value"));
        assert!(expand_list("debug=1", &k).unwrap_err().contains("takes no value"));
        let args: Vec<OsString> = ["xpackfs", "mount", "src", "-o", "top_k=-1", "-oallow_other", "mnt"].iter().map(OsString::from).collect();
        let got = expand(args, 2, &k).unwrap();
        assert_eq!(got, ["xpackfs", "mount", "src", "--top-k=-1", "--allow-other", "mnt"].map(OsString::from));
    }
}
