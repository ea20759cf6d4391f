//! Credentials the storage crate does not read itself: an AWS shared-credentials profile
//! (`AWS_PROFILE`, `~/.aws/credentials` and `~/.aws/config`, as the AWS CLI reads them;
//! `object_store` reads the environment, web identity and instance metadata but not these
//! files) and the Hugging Face token (`HF_TOKEN`, else the file huggingface_hub writes at
//! login). Values are returned to the clients only; nothing here logs them.

use std::path::PathBuf;

#[derive(Clone, Default)]
pub struct AwsProfile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
}

impl std::fmt::Debug for AwsProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsProfile").field("has_keys", &self.access_key_id.is_some()).field("region", &self.region).finish()
    }
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// The `[section]`'s `key = value` pairs of an INI file.
fn ini_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    out
}

/// The profile named by `AWS_PROFILE` (else `default`) from the shared files, if any.
pub fn aws_profile() -> Option<AwsProfile> {
    let name = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let creds_path = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE").map(PathBuf::from).or_else(|| home().map(|h| h.join(".aws/credentials")));
    let config_path = std::env::var_os("AWS_CONFIG_FILE").map(PathBuf::from).or_else(|| home().map(|h| h.join(".aws/config")));
    let read = |p: Option<PathBuf>| p.and_then(|p| std::fs::read_to_string(p).ok());
    let mut out = AwsProfile::default();
    let mut found = false;
    if let Some(text) = read(creds_path) {
        for (k, v) in ini_section(&text, &name) {
            found = true;
            match k.as_str() {
                "aws_access_key_id" => out.access_key_id = Some(v),
                "aws_secret_access_key" => out.secret_access_key = Some(v),
                "aws_session_token" => out.session_token = Some(v),
                "region" => out.region = Some(v),
                _ => {}
            }
        }
    }
    if let Some(text) = read(config_path) {
        let section = if name == "default" { "default".to_string() } else { format!("profile {name}") };
        for (k, v) in ini_section(&text, &section) {
            found = true;
            match k.as_str() {
                "region" if out.region.is_none() => out.region = Some(v),
                "aws_access_key_id" if out.access_key_id.is_none() => out.access_key_id = Some(v),
                "aws_secret_access_key" if out.secret_access_key.is_none() => out.secret_access_key = Some(v),
                _ => {}
            }
        }
    }
    found.then_some(out)
}

/// The Hugging Face token: `HF_TOKEN`, else `$HF_TOKEN_PATH`, else `$HF_HOME/token`
/// (default `~/.cache/huggingface/token`), as huggingface_hub reads it.
pub fn hf_token() -> Option<String> {
    if let Ok(t) = std::env::var("HF_TOKEN")
        && !t.trim().is_empty()
    {
        return Some(t.trim().to_string());
    }
    let path = std::env::var_os("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
        std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("token")).or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(|c| PathBuf::from(c).join("huggingface/token"))
                .or_else(|| home().map(|h| h.join(".cache/huggingface/token")))
        })
    })?;
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_named_section_only() {
        let text = "[default]\naws_access_key_id = A\n[other]\naws_access_key_id=B\nregion = eu-west-1\n# c\n";
        assert_eq!(ini_section(text, "other"), vec![("aws_access_key_id".into(), "B".into()), ("region".into(), "eu-west-1".into())]);
        assert_eq!(ini_section(text, "default"), vec![("aws_access_key_id".into(), "A".into())]);
        assert!(ini_section(text, "missing").is_empty());
    }
}
