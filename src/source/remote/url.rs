//! Remote source URLs: which store, which bucket (container, host, Hub repo), which key.
//! A URL is carried through the rest of the program as a path (`s3://bucket/dir/file`),
//! so `join`, `parent` and `file_name` work on it as on a local path; this module
//! parses such a path back into its parts.

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    S3,
    Gs,
    Az,
    Http,
    Https,
    Hf,
}

impl Scheme {
    pub fn prefix(self) -> &'static str {
        match self {
            Scheme::S3 => "s3://",
            Scheme::Gs => "gs://",
            Scheme::Az => "az://",
            Scheme::Http => "http://",
            Scheme::Https => "https://",
            Scheme::Hf => "hf://",
        }
    }
}

/// Why a remote URL is refused; each names the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0}: query strings and fragments are not part of a source URL")]
    Query(String),
    /// No bucket, container or host (`what`), or no Hub repository.
    #[error("{url}: no {what} in the URL")]
    NoRoot { url: String, what: &'static str },
    #[error("{0}: empty revision after '@'")]
    EmptyRevision(String),
    #[error("{0}: a Hub repository is ORG/NAME (hf://ORG/NAME[@REVISION][/PATH])")]
    NoRepoName(String),
    #[error("{0}: '.' and '..' are not allowed in a source URL")]
    DotSegment(String),
}

/// A parsed remote URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    pub scheme: Scheme,
    /// The bucket (s3, gs), container (az), `host[:port]` (http, https) or `org/name` (hf).
    pub root: String,
    /// For hf: the revision after `@` (default `main`).
    pub revision: Option<String>,
    /// The key inside the root, without a leading or trailing slash ("" for the root).
    pub key: String,
}

const SCHEMES: [Scheme; 6] = [Scheme::S3, Scheme::Gs, Scheme::Az, Scheme::Http, Scheme::Https, Scheme::Hf];

/// The scheme of `s`, if it is a remote URL.
pub fn scheme_of(s: &str) -> Option<Scheme> {
    SCHEMES.into_iter().find(|sc| s.len() > sc.prefix().len() && s[..sc.prefix().len()].eq_ignore_ascii_case(sc.prefix()))
}

/// `s3://bucket/key` as a path may have lost a slash (`s3:/bucket/key`) when a path was
/// normalised; put it back.
fn repair(s: &str) -> String {
    for sc in SCHEMES {
        let one = &sc.prefix()[..sc.prefix().len() - 1];
        if s.len() > one.len() && s[..one.len()].eq_ignore_ascii_case(one) && !s[one.len()..].starts_with('/') {
            return format!("{}{}", sc.prefix(), &s[one.len()..]);
        }
    }
    s.to_string()
}

impl RemoteUrl {
    /// Parse a remote URL; `None` if `p` is not one.
    pub fn parse_path(p: &Path) -> Option<Result<RemoteUrl, UrlError>> {
        let s = repair(p.to_str()?);
        let scheme = scheme_of(&s)?;
        Some(Self::parse_str(&s, scheme))
    }

    fn parse_str(s: &str, scheme: Scheme) -> Result<RemoteUrl, UrlError> {
        let rest = &s[scheme.prefix().len()..];
        if rest.contains(['?', '#']) {
            return Err(UrlError::Query(s.to_string()));
        }
        let mut parts = rest.splitn(2, '/');
        let first = parts.next().unwrap_or("");
        let tail = parts.next().unwrap_or("");
        if first.is_empty() {
            return Err(UrlError::NoRoot { url: s.to_string(), what: if scheme == Scheme::Hf { "repository" } else { "bucket or host" } });
        }
        let (root, revision, key) = if scheme == Scheme::Hf {
            // hf://ORG/NAME[@REVISION][/PATH]
            let mut t = tail.splitn(2, '/');
            let name_rev = t.next().unwrap_or("");
            let path = t.next().unwrap_or("");
            let (name, rev) = match name_rev.split_once('@') {
                Some((n, r)) if !r.is_empty() => (n, Some(r.to_string())),
                Some(_) => return Err(UrlError::EmptyRevision(s.to_string())),
                None => (name_rev, None),
            };
            if name.is_empty() {
                return Err(UrlError::NoRepoName(s.to_string()));
            }
            (format!("{first}/{name}"), rev, path)
        } else {
            (first.to_string(), None, tail)
        };
        let key = key.trim_matches('/');
        if key.split('/').any(|c| c == ".." || c == ".") {
            return Err(UrlError::DotSegment(s.to_string()));
        }
        Ok(RemoteUrl { scheme, root, revision, key: key.to_string() })
    }

    /// The namespace this URL lives in, as text: `s3://bucket`, `hf://org/name@rev`.
    pub fn namespace(&self) -> String {
        match &self.revision {
            Some(r) => format!("{}{}@{r}", self.scheme.prefix(), self.root),
            None => format!("{}{}", self.scheme.prefix(), self.root),
        }
    }

    /// The URL as text.
    pub fn display(&self) -> String {
        if self.key.is_empty() { self.namespace() } else { format!("{}/{}", self.namespace(), self.key) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> RemoteUrl {
        RemoteUrl::parse_path(Path::new(s)).unwrap().unwrap()
    }

    #[test]
    fn parses_each_scheme() {
        let u = p("s3://bucket/dir/model.gguf");
        assert_eq!((u.scheme, u.root.as_str(), u.key.as_str()), (Scheme::S3, "bucket", "dir/model.gguf"));
        assert_eq!(p("s3://bucket/dir/").key, "dir");
        assert_eq!(p("gs://b").key, "");
        assert_eq!(p("az://container/x").root, "container");
        let u = p("https://127.0.0.1:8080/a/b.gguf");
        assert_eq!((u.scheme, u.root.as_str(), u.key.as_str()), (Scheme::Https, "127.0.0.1:8080", "a/b.gguf"));
        let u = p("hf://org/name@v1.0/sub/m.gguf");
        assert_eq!((u.root.as_str(), u.revision.as_deref(), u.key.as_str()), ("org/name", Some("v1.0"), "sub/m.gguf"));
        assert_eq!(u.display(), "hf://org/name@v1.0/sub/m.gguf");
        let u = p("hf://org/name");
        assert_eq!((u.root.as_str(), u.revision, u.key.as_str()), ("org/name", None, ""));
    }

    #[test]
    fn a_path_that_lost_a_slash_is_repaired_and_local_paths_are_not_urls() {
        assert_eq!(p("s3:/bucket/k").display(), "s3://bucket/k");
        assert!(RemoteUrl::parse_path(Path::new("/data/model.gguf")).is_none());
        assert!(RemoteUrl::parse_path(Path::new("s3data/model.gguf")).is_none());
    }

    #[test]
    fn refuses_what_it_cannot_mean() {
        for bad in ["s3:///key", "hf://org", "hf://org/@main", "hf://org/name@", "s3://b/a/../c", "https://h/x?sig=1"] {
            assert!(RemoteUrl::parse_path(Path::new(bad)).unwrap().is_err(), "{bad}");
        }
    }
}
