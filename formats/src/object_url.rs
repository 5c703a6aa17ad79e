//! `ObjectUrl`: the URL of an object (or of a prefix, or a glob pattern over keys) in an object
//! store: `s3://bucket/key`, `gs://bucket/key`, `az://container/key`, `https://host/path`
//! (`http://` too). Parsing and the component-wise prefix test need no client: a dispatcher
//! built without the `object-store` feature still checks a listed URL against its data roots.
//!
//! A key is compared by its `/`-separated components, as a local path is: `s3://b/data2/x` is
//! not below `s3://b/data`. A store resolves no `.` or `..`, so such a component (or an empty
//! one, `a//b`) would only make two spellings of one root differ; they are refused outright, with
//! the URL named.

use sluice_element::DatasetError;

/// The kinds of store a URL can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Amazon S3 and S3-compatible stores (`s3://bucket/key`).
    S3,
    /// Google Cloud Storage (`gs://bucket/key`).
    Gcs,
    /// Azure Blob Storage (`az://container/key`).
    Azure,
    /// A plain HTTPS server (`https://host/path`).
    Https,
    /// A plain HTTP server (`http://host/path`).
    Http,
}

impl Scheme {
    /// The URL prefix, `s3://` etc.
    pub fn prefix(self) -> &'static str {
        match self {
            Scheme::S3 => "s3://",
            Scheme::Gcs => "gs://",
            Scheme::Azure => "az://",
            Scheme::Https => "https://",
            Scheme::Http => "http://",
        }
    }

    const ALL: [Scheme; 5] = [
        Scheme::S3,
        Scheme::Gcs,
        Scheme::Azure,
        Scheme::Https,
        Scheme::Http,
    ];
}

/// Whether `path` is meant as an object-store URL (it starts with one of the schemes above), so
/// is never read as a local path.
pub fn is_object_url(path: &str) -> bool {
    Scheme::ALL
        .iter()
        .any(|s| starts_with_ignore_case(path, s.prefix()))
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len()
        && s.is_char_boundary(prefix.len())
        && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// A parsed object URL: the store (scheme and bucket, container or host) and the key, without a
/// leading `/`. An empty key names the whole bucket (a root).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    pub scheme: Scheme,
    /// The bucket (S3, GCS), container (Azure) or host with its port (HTTP).
    pub bucket: String,
    /// The key's components joined by `/`; empty for the whole bucket.
    pub key: String,
}

impl ObjectUrl {
    /// Parses `url`; an error names it and what is wrong. A trailing `/` is allowed (a prefix).
    pub fn parse(url: &str) -> Result<ObjectUrl, DatasetError> {
        let bad = |why: &str| DatasetError::invalid(format!("invalid object URL '{url}': {why}"));
        let scheme = Scheme::ALL
            .into_iter()
            .find(|s| starts_with_ignore_case(url, s.prefix()))
            .ok_or_else(|| bad("it starts with none of s3://, gs://, az://, https://, http://"))?;
        let rest = &url[scheme.prefix().len()..];
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("it names no bucket"));
        }
        if bucket.contains(['*', '?', '[']) {
            return Err(bad("a bucket name cannot be a pattern; only keys can"));
        }
        // Credentials, queries and fragments do not belong in a definition: a client's secrets
        // would travel in the replicated definition and reach logs and status pages.
        if bucket.contains(['@', '#', '\\']) || bucket.chars().any(char::is_whitespace) {
            return Err(bad(
                "the bucket or host has characters a URL here may not carry (@, #, \\, spaces)",
            ));
        }
        if key.chars().any(char::is_control) {
            return Err(bad("the key has control characters"));
        }
        if key.contains('#')
            || (matches!(scheme, Scheme::Http | Scheme::Https) && key.contains('?'))
        {
            return Err(bad("it has a query or fragment"));
        }
        let key = key.strip_suffix('/').unwrap_or(key);
        if !key.is_empty()
            && key
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(bad("its key has an empty, '.' or '..' component"));
        }
        let bucket = match scheme {
            // Host names are case-insensitive; bucket names are not.
            Scheme::Http | Scheme::Https => bucket.to_ascii_lowercase(),
            _ => bucket.to_string(),
        };
        Ok(ObjectUrl {
            scheme,
            bucket,
            key: key.to_string(),
        })
    }

    /// Whether `self` lies at or below `root`, comparing whole key components.
    pub fn is_below(&self, root: &ObjectUrl) -> bool {
        self.scheme == root.scheme
            && self.bucket == root.bucket
            && (root.key.is_empty()
                || self.key == root.key
                || self
                    .key
                    .strip_prefix(&root.key)
                    .is_some_and(|rest| rest.starts_with('/')))
    }

    /// The components of the key before the first one with a glob character (`*`, `?`, `[`):
    /// the prefix a pattern's listing starts at. The whole key when it has none.
    pub fn literal_prefix(&self) -> ObjectUrl {
        let literal: Vec<&str> = self
            .key
            .split('/')
            .filter(|c| !c.is_empty())
            .take_while(|c| !c.contains(['*', '?', '[']))
            .collect();
        ObjectUrl {
            key: literal.join("/"),
            ..self.clone()
        }
    }

    /// Whether the key has a glob character.
    pub fn is_pattern(&self) -> bool {
        self.key.contains(['*', '?', '['])
    }

    /// The URL of `key` in the same store.
    pub fn with_key(&self, key: &str) -> ObjectUrl {
        ObjectUrl {
            key: key.to_string(),
            ..self.clone()
        }
    }
}

impl std::fmt::Display for ObjectUrl {
    /// The normalized URL: `s3://bucket/key` (`s3://bucket` for the whole bucket).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.scheme.prefix(), self.bucket)?;
        if !self.key.is_empty() {
            write!(f, "/{}", self.key)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_to_store_and_key() {
        let u = ObjectUrl::parse("s3://bucket/a/b.tfrecord").unwrap();
        assert_eq!(
            (u.scheme, &*u.bucket, &*u.key),
            (Scheme::S3, "bucket", "a/b.tfrecord")
        );
        assert_eq!(u.to_string(), "s3://bucket/a/b.tfrecord");
        let root = ObjectUrl::parse("S3://bucket/").unwrap();
        assert_eq!(root.to_string(), "s3://bucket");
        let h = ObjectUrl::parse("https://Example.COM:8443/x/y").unwrap();
        assert_eq!((h.scheme, &*h.bucket), (Scheme::Https, "example.com:8443"));
        assert!(is_object_url("gs://b/k") && is_object_url("AZ://c/k"));
        assert!(!is_object_url("/data/s3://x") && !is_object_url("s3:/x") && !is_object_url("é"));
    }

    #[test]
    fn malformed_urls_are_refused_naming_them() {
        for (url, why) in [
            ("s3:///key", "names no bucket"),
            ("s3://b*/key", "cannot be a pattern"),
            ("s3://AKIA:secret@b/key", "may not carry"),
            ("s3://b/a/../secret", "'..' component"),
            ("s3://b/a//c", "empty"),
            ("s3://b/./c", "'.'"),
            ("https://h/x?sig=1", "query"),
            ("s3://b/x\n", "control"),
            ("file:///etc/passwd", "none of"),
        ] {
            let e = ObjectUrl::parse(url).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("invalid object URL '{url}'")) && e.contains(why),
                "{url}: {e}"
            );
        }
    }

    #[test]
    fn below_compares_whole_components_of_the_same_store() {
        let root = ObjectUrl::parse("s3://b/data").unwrap();
        let p = |u: &str| ObjectUrl::parse(u).unwrap();
        assert!(p("s3://b/data/x").is_below(&root));
        assert!(p("s3://b/data").is_below(&root));
        assert!(!p("s3://b/data2/x").is_below(&root));
        assert!(!p("s3://b/dat").is_below(&root));
        assert!(!p("s3://c/data/x").is_below(&root));
        assert!(!p("gs://b/data/x").is_below(&root));
        assert!(p("s3://b/anything").is_below(&p("s3://b")));
    }

    #[test]
    fn a_patterns_literal_prefix_stops_at_the_first_glob_component() {
        let p = ObjectUrl::parse("s3://b/data/train-*/x?.tfrecord").unwrap();
        assert!(p.is_pattern());
        assert_eq!(p.literal_prefix().to_string(), "s3://b/data");
        let whole = ObjectUrl::parse("s3://b/*.txt").unwrap();
        assert_eq!(whole.literal_prefix().to_string(), "s3://b");
        let literal = ObjectUrl::parse("s3://b/a/b").unwrap();
        assert!(!literal.is_pattern());
        assert_eq!(literal.literal_prefix(), literal);
    }
}
