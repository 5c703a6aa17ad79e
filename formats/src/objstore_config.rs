//! Per-store settings of a worker or dispatcher (`--object-store-config FILE`): endpoint, region,
//! credentials and client options of each object store, beside (and over) the environment the
//! store's client reads.
//!
//! The file is JSON: an object `stores` whose keys name a store, `SCHEME://BUCKET` (a bucket,
//! container or HTTP host) or `SCHEME://` (every store of the scheme that no bucket entry
//! names), and whose values are objects of `object_store`'s configuration keys (`endpoint`,
//! `region`, `allow_http`, `access_key_id`, `secret_access_key`, `service_account_key`,
//! `account_name`, `access_key`, `timeout`, ...: the names its builders' `with_config` parse,
//! with or without their `aws_`/`google_`/`azure_` prefix). A value is a string, a boolean, a
//! number, `{"env": "NAME"}` (the environment variable's value, read when the file is loaded) or
//! `{"file": "PATH"}` (the file's contents, less surrounding white space):
//!
//! ```json
//! {"stores": {
//!   "s3://training-data": {
//!     "endpoint": "http://minio.storage:9000", "region": "us-east-1", "allow_http": true,
//!     "access_key_id": {"env": "MINIO_ACCESS_KEY"},
//!     "secret_access_key": {"file": "/run/secrets/minio-secret"}},
//!   "gs://": {"service_account_path": "/etc/sluice/gcs.json"}
//! }}
//! ```
//!
//! A store's client is built from the environment first, then the `SCHEME://` entry's options,
//! then the bucket's: the file wins. Secrets stay out of everything shown: every value read from
//! a variable or a file, and every value of a key that names a secret (`secret`, `key`, `token`,
//! `password`, `sas`, `credential`), is masked in error texts (see `objstore::masked`); the
//! settings' `Debug` shows keys only; errors about the file name the entry and the key, never a
//! value. Definitions never carry any of it: the settings are the process's own. A process given
//! no settings by a flag (a trainer that expands a pattern itself) reads the file that
//! `$SLUICE_OBJECT_STORE_CONFIG` names, if set.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::object_url::Scheme;

/// Words in a key's name that make its value a secret (masked wherever it could be shown).
const SECRET_WORDS: [&str; 6] = ["secret", "key", "token", "password", "sas", "credential"];

/// The settings of every configured store, as loaded from a file.
#[derive(Clone, Default)]
pub struct ObjectStoreSettings {
    /// By (scheme, bucket); an empty bucket is the scheme's entry for every bucket.
    stores: BTreeMap<(SchemeKey, String), Vec<(String, String)>>,
    /// The values that must never be shown.
    secrets: Vec<String>,
}

/// `Scheme` ordered, for the map's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SchemeKey(u8);

impl SchemeKey {
    /// The scheme's URL prefix (the inverse of `of`).
    fn prefix(self) -> &'static str {
        ["s3://", "gs://", "az://", "https://", "http://"][self.0 as usize]
    }

    fn of(scheme: Scheme) -> SchemeKey {
        SchemeKey(match scheme {
            Scheme::S3 => 0,
            Scheme::Gcs => 1,
            Scheme::Azure => 2,
            Scheme::Https => 3,
            Scheme::Http => 4,
        })
    }
}

impl std::fmt::Debug for ObjectStoreSettings {
    /// Stores and keys only: a value may be a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        for ((scheme, bucket), options) in &self.stores {
            let keys: Vec<&str> = options.iter().map(|(k, _)| k.as_str()).collect();
            map.entry(&format!("{}{bucket}", scheme.prefix()), &keys);
        }
        map.finish()
    }
}

impl ObjectStoreSettings {
    /// Loads the settings file at `path`; an error names the file, and the entry and key at
    /// fault, never a value.
    pub fn load(path: &Path) -> Result<ObjectStoreSettings, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("object-store config {shown}: cannot read it: {e}"))?;
        Self::parse(&text, &|key| {
            // Relative secret files are relative to the config file's directory.
            let dir = path.parent().unwrap_or(Path::new("."));
            dir.join(key)
        })
        .map_err(|e| format!("object-store config {shown}: {e}"))
    }

    /// Parses a settings file's text; `resolve` turns a `{"file": ...}` path into the one to
    /// read.
    fn parse(
        text: &str,
        resolve: &dyn Fn(&str) -> std::path::PathBuf,
    ) -> Result<ObjectStoreSettings, String> {
        // serde_json's errors name a line and column, and may quote the offending text, which
        // could be a secret: only the position is kept.
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("not valid JSON (line {}, column {})", e.line(), e.column()))?;
        let serde_json::Value::Object(top) = value else {
            return Err("the file must be a JSON object with a \"stores\" object".into());
        };
        if let Some(other) = top.keys().find(|k| *k != "stores") {
            return Err(format!(
                "unknown top-level key '{other}' (the only one is \"stores\")"
            ));
        }
        let Some(serde_json::Value::Object(stores)) = top.get("stores") else {
            return Err("\"stores\" must be an object of store URL to options".into());
        };
        let mut settings = ObjectStoreSettings::default();
        for (store, options) in stores {
            let (scheme, bucket) = store_key(store)?;
            let serde_json::Value::Object(options) = options else {
                return Err(format!("store '{store}': its options must be an object"));
            };
            let mut parsed = Vec::new();
            for (key, value) in options {
                check_key(scheme, key).map_err(|why| format!("store '{store}': {why}"))?;
                let (value, from_outside) = option_value(value, resolve)
                    .map_err(|why| format!("store '{store}', option '{key}': {why}"))?;
                let lower = key.to_ascii_lowercase();
                let secret = from_outside || SECRET_WORDS.iter().any(|w| lower.contains(w));
                if secret && value.len() >= 4 {
                    settings.secrets.push(value.clone());
                }
                parsed.push((key.clone(), value));
            }
            settings
                .stores
                .insert((SchemeKey::of(scheme), bucket), parsed);
        }
        Ok(settings)
    }

    /// The options for the store of `scheme` and `bucket`, in the order they apply: the
    /// scheme's entry, then the bucket's.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn options_for(&self, scheme: Scheme, bucket: &str) -> Vec<(String, String)> {
        let key = SchemeKey::of(scheme);
        let mut out = Vec::new();
        for b in ["", bucket] {
            if let Some(options) = self.stores.get(&(key, b.to_string())) {
                out.extend(options.iter().cloned());
            }
            if bucket.is_empty() {
                break;
            }
        }
        out
    }

    /// The values never to show.
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    pub(crate) fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// Whether no store is configured.
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }
}

/// The settings in force in this process, and how many times they were set (stores built under
/// older settings are built again).
static SETTINGS: RwLock<Option<Arc<ObjectStoreSettings>>> = RwLock::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Makes `settings` the ones every store of this process is built with from now on (a worker
/// or dispatcher does this at start, from `--object-store-config`). The secrets of settings set
/// before stay masked.
pub fn set_object_store_settings(settings: ObjectStoreSettings) {
    let mut current = SETTINGS.write().unwrap_or_else(|e| e.into_inner());
    let mut settings = settings;
    if let Some(old) = current.as_ref() {
        for secret in &old.secrets {
            if !settings.secrets.contains(secret) {
                settings.secrets.push(secret.clone());
            }
        }
    }
    *current = Some(Arc::new(settings));
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// Loads the settings file at `path` and makes it the process's (see
/// [`set_object_store_settings`]); an error names the file and never a value.
pub fn load_object_store_settings(path: &Path) -> Result<(), String> {
    set_object_store_settings(ObjectStoreSettings::load(path)?);
    Ok(())
}

/// The variable naming a settings file for a process given none by a flag (a trainer that
/// expands patterns itself, a `sluice read`): read at the first store the process builds.
pub const SETTINGS_ENV: &str = "SLUICE_OBJECT_STORE_CONFIG";

/// The settings in force, and their generation: those set (by a server's flag), else those of
/// the file `$SLUICE_OBJECT_STORE_CONFIG` names, else none. An error is the file's.
#[cfg_attr(not(feature = "object-store"), allow(dead_code))]
pub(crate) fn current_settings() -> Result<(Arc<ObjectStoreSettings>, u64), String> {
    {
        let current = SETTINGS.read().unwrap_or_else(|e| e.into_inner());
        // Read under the lock, so a generation never goes with older settings.
        let generation = GENERATION.load(Ordering::SeqCst);
        if let Some(settings) = current.as_ref() {
            return Ok((settings.clone(), generation));
        }
        if std::env::var_os(SETTINGS_ENV).is_none() {
            return Ok((Arc::default(), generation));
        }
    }
    let path = std::env::var_os(SETTINGS_ENV).unwrap_or_default();
    let loaded = ObjectStoreSettings::load(Path::new(&path))
        .map_err(|e| format!("{e} (named by {SETTINGS_ENV})"))?;
    let mut current = SETTINGS.write().unwrap_or_else(|e| e.into_inner());
    if current.is_none() {
        *current = Some(Arc::new(loaded));
        GENERATION.fetch_add(1, Ordering::SeqCst);
    }
    let settings = current.clone().unwrap_or_default();
    Ok((settings, GENERATION.load(Ordering::SeqCst)))
}

/// A store entry's name as (scheme, bucket): `s3://bucket`, or `s3://` for every bucket.
fn store_key(store: &str) -> Result<(Scheme, String), String> {
    let bad = |why: &str| format!("store '{store}': {why}");
    let scheme = [
        Scheme::S3,
        Scheme::Gcs,
        Scheme::Azure,
        Scheme::Https,
        Scheme::Http,
    ]
    .into_iter()
    .find(|s| {
        store.len() >= s.prefix().len()
            && store.is_char_boundary(s.prefix().len())
            && store[..s.prefix().len()].eq_ignore_ascii_case(s.prefix())
    })
    .ok_or_else(|| bad("it starts with none of s3://, gs://, az://, https://, http://"))?;
    let bucket = &store[scheme.prefix().len()..];
    let bucket = bucket.strip_suffix('/').unwrap_or(bucket);
    if bucket.contains(['/', '*', '?', '[', '@', '#', '\\']) || bucket.contains(char::is_whitespace)
    {
        return Err(bad(
            "name a whole store, SCHEME://BUCKET or SCHEME:// (settings are per bucket, \
             container or host, not per key prefix)",
        ));
    }
    let bucket = match scheme {
        Scheme::Http | Scheme::Https => bucket.to_ascii_lowercase(),
        _ => bucket.to_string(),
    };
    Ok((scheme, bucket))
}

/// An option's value as a string, and whether it came from a variable or a file.
fn option_value(
    value: &serde_json::Value,
    resolve: &dyn Fn(&str) -> std::path::PathBuf,
) -> Result<(String, bool), String> {
    use serde_json::Value as V;
    Ok(match value {
        V::String(s) => (s.clone(), false),
        V::Bool(b) => (b.to_string(), false),
        V::Number(n) => (n.to_string(), false),
        V::Object(o) if o.len() == 1 && o.contains_key("env") => {
            let Some(V::String(name)) = o.get("env") else {
                return Err("\"env\" must name a variable".into());
            };
            let value = std::env::var(name).map_err(|_| {
                format!("the environment variable {name} is not set (or not UTF-8)")
            })?;
            (value, true)
        }
        V::Object(o) if o.len() == 1 && o.contains_key("file") => {
            let Some(V::String(file)) = o.get("file") else {
                return Err("\"file\" must name a file".into());
            };
            let path = resolve(file);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            (text.trim().to_string(), true)
        }
        _ => {
            return Err(
                "a value is a string, a boolean, a number, {\"env\": NAME} or {\"file\": PATH}"
                    .into(),
            )
        }
    })
}

/// Refuses a key the scheme's client does not know, naming it (never its value).
fn check_key(scheme: Scheme, key: &str) -> Result<(), String> {
    #[cfg(feature = "object-store")]
    {
        use std::str::FromStr;
        let known = match scheme {
            Scheme::S3 => object_store::aws::AmazonS3ConfigKey::from_str(key).is_ok(),
            Scheme::Gcs => object_store::gcp::GoogleConfigKey::from_str(key).is_ok(),
            Scheme::Azure => object_store::azure::AzureConfigKey::from_str(key).is_ok(),
            Scheme::Https | Scheme::Http => object_store::ClientConfigKey::from_str(key).is_ok(),
        };
        if !known {
            return Err(format!(
                "unknown option '{key}' for {} stores (the names are object_store's \
                 configuration keys, such as endpoint, region, allow_http, access_key_id)",
                scheme.prefix()
            ));
        }
    }
    #[cfg(not(feature = "object-store"))]
    let _ = (scheme, key);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn parse(text: &str) -> Result<ObjectStoreSettings, String> {
        ObjectStoreSettings::parse(text, &|p| PathBuf::from(p))
    }

    #[test]
    fn options_apply_scheme_then_bucket() {
        let s = parse(
            r#"{"stores": {"s3://": {"region": "eu-west-1", "allow_http": true},
                          "s3://b": {"endpoint": "http://127.0.0.1:9000", "timeout": 30}}}"#,
        )
        .unwrap();
        assert_eq!(
            s.options_for(Scheme::S3, "b"),
            vec![
                ("allow_http".to_string(), "true".to_string()),
                ("region".into(), "eu-west-1".into()),
                ("endpoint".into(), "http://127.0.0.1:9000".into()),
                ("timeout".into(), "30".into()),
            ]
        );
        assert_eq!(s.options_for(Scheme::S3, "other").len(), 2);
        assert!(s.options_for(Scheme::Gcs, "b").is_empty());
    }

    #[test]
    fn secrets_from_env_files_and_secret_keys_are_kept_for_masking() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "file-secret-value\n").unwrap();
        std::env::set_var("SLUICE_TEST_OBJSTORE_ID", "env-key-id-value");
        let text = format!(
            r#"{{"stores": {{"s3://b": {{
                "access_key_id": {{"env": "SLUICE_TEST_OBJSTORE_ID"}},
                "secret_access_key": {{"file": "{}"}},
                "session_token": "inline-token-value",
                "region": "us-east-1"}}}}}}"#,
            dir.path().join("secret").display()
        );
        let s = parse(&text).unwrap();
        let mut secrets = s.secrets().to_vec();
        secrets.sort();
        assert_eq!(
            secrets,
            [
                "env-key-id-value",
                "file-secret-value",
                "inline-token-value"
            ]
        );
        // Debug shows the keys, never a value.
        let debug = format!("{s:?}");
        assert!(debug.contains("\"s3://b\": ["), "{debug}");
        assert!(debug.contains("secret_access_key"), "{debug}");
        for secret in s.secrets() {
            assert!(!debug.contains(secret.as_str()), "{debug}");
        }
    }

    #[test]
    fn errors_name_the_entry_and_key_never_the_value() {
        let err =
            parse(r#"{"stores": {"s3://b": {"no_such_option": "hunter2-secret"}}}"#).unwrap_err();
        assert!(
            err.contains("no_such_option") && err.contains("s3://b"),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
        let err = parse(r#"{"stores": {"s3://b": {"secret_access_key": ["hunter2-secret"]}}}"#)
            .unwrap_err();
        assert!(err.contains("secret_access_key"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        // A syntax error keeps the position only (serde_json may quote the text).
        let err = parse(r#"{"stores": {"s3://b": {"secret_access_key": hunter2}}}"#).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err =
            parse(r#"{"stores": {"s3://b": {"access_key_id": {"env": "SLUICE_TEST_UNSET_VAR"}}}}"#)
                .unwrap_err();
        assert!(err.contains("SLUICE_TEST_UNSET_VAR"), "{err}");
    }

    #[test]
    fn store_names_are_whole_stores() {
        for bad in ["s3://b/prefix", "ftp://b", "s3://b*", "gs://a@b"] {
            let text = format!(r#"{{"stores": {{"{bad}": {{}}}}}}"#);
            let err = parse(&text).unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        for bad in [r#"[]"#, r#"{"store": {}}"#, r#"{"stores": []}"#] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let s = parse(r#"{"stores": {"https://Files.Example.com/": {"timeout": "5s"}}}"#).unwrap();
        assert_eq!(s.options_for(Scheme::Https, "files.example.com").len(), 1);
    }
}
