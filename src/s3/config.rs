//! Where the S3 client's settings come from: the usual sources of the AWS
//! tools, in their order.
//!
//! - Credentials: given explicitly; else, unless a profile was named, the
//!   environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!   `AWS_SESSION_TOKEN`); else the profile (`--profile`, `AWS_PROFILE`,
//!   `default`) in the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
//!   `~/.aws/credentials`), then in the config file (`AWS_CONFIG_FILE`,
//!   `~/.aws/config`, where a profile's section is `[profile NAME]` and the
//!   default's `[default]`).
//! - Region: given; `AWS_REGION`; `AWS_DEFAULT_REGION`; the profile's
//!   `region`; `us-east-1`.
//! - Endpoint: given; `AWS_ENDPOINT_URL_S3`; `AWS_ENDPOINT_URL`; the
//!   profile's `endpoint_url`; `https://s3.REGION.amazonaws.com`.
//!
//! The files are read here rather than through the AWS SDK's loader
//! (`aws-config`), which needs an async runtime and brings the STS and SSO
//! clients; assume-role and SSO profiles are not followed (a profile
//! without keys is an error that says so). The parser takes the format's
//! rules that matter for keys: `#` and `;` comments, `key = value`, and
//! indented sub-settings (`s3 =` followed by indented lines), which belong
//! to their parent and are skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Access keys. `Debug` never shows the secret or the session token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `aws_access_key_id`
    pub access_key_id: String,
    /// `aws_secret_access_key`
    pub secret_access_key: String,
    /// `aws_session_token`, for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// What the caller sets explicitly (command-line options); `None` leaves
/// it to the other sources.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--profile`.
    pub profile: Option<String>,
    /// `--endpoint`.
    pub endpoint: Option<String>,
    /// `--region`.
    pub region: Option<String>,
    /// Keys given directly.
    pub credentials: Option<Credentials>,
}

/// The resolved settings of an S3 client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    /// `http://host:port` or `https://...`, without a trailing slash.
    pub endpoint: String,
    /// The signing region.
    pub region: String,
    /// The keys.
    pub credentials: Credentials,
    /// Where the keys came from (`environment`, `profile NAME in FILE`...),
    /// for messages.
    pub credentials_source: String,
}

/// A setting that could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("S3 configuration: {0}")]
pub struct ConfigError(pub String);

/// Sections of an AWS config or credentials file: name to keys.
type Sections = HashMap<String, HashMap<String, String>>;

/// Parses the text of an AWS config or credentials file.
pub fn parse_profile_file(text: &str) -> Sections {
    let mut sections = Sections::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        // An indented line continues the setting above it (a sub-section
        // such as `s3 =`): not a key of the profile.
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let (Some(section), Some((key, value))) = (&current, trimmed.split_once('=')) else {
            continue;
        };
        let value = value.trim();
        // A value may carry an inline comment after whitespace.
        let value = value
            .split_once(" #")
            .or_else(|| value.split_once(" ;"))
            .map_or(value, |(v, _)| v.trim_end());
        sections
            .entry(section.clone())
            .or_default()
            .insert(key.trim().to_ascii_lowercase(), value.to_owned());
    }
    sections
}

/// Where the environment's lookups come from: the process's, or a test's.
pub trait Env {
    /// The variable's value, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;
    /// The user's home directory.
    fn home(&self) -> Option<PathBuf>;
}

/// The process's environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    fn home(&self) -> Option<PathBuf> {
        self.var("HOME").map(PathBuf::from)
    }
}

/// The profile's settings from both files: the credentials file's first.
struct Profile {
    name: String,
    credentials: Option<(HashMap<String, String>, PathBuf)>,
    config: Option<HashMap<String, String>>,
    config_path: PathBuf,
}

impl Profile {
    fn load(env: &dyn Env, name: &str) -> Result<Profile, ConfigError> {
        let home = env.home();
        let path = |var: &str, file: &str| {
            env.var(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(file)))
        };
        let credentials_path = path("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config_path = path("AWS_CONFIG_FILE", "config").unwrap_or_default();
        let credentials = match &credentials_path {
            Some(p) => read_sections(p)?
                .and_then(|mut s| s.remove(name))
                .map(|keys| (keys, p.clone())),
            None => None,
        };
        let section = if name == "default" {
            "default".to_owned()
        } else {
            format!("profile {name}")
        };
        let config = read_sections(&config_path)?.and_then(|mut s| s.remove(&section));
        Ok(Profile {
            name: name.to_owned(),
            credentials,
            config,
            config_path,
        })
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.credentials
            .as_ref()
            .and_then(|(keys, _)| keys.get(key))
            .or_else(|| self.config.as_ref().and_then(|keys| keys.get(key)))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn exists(&self) -> bool {
        self.credentials.is_some() || self.config.is_some()
    }
}

/// A file's sections; `None` when it does not exist.
fn read_sections(path: &Path) -> Result<Option<Sections>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(parse_profile_file(&text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if path.as_os_str().is_empty() => Err(ConfigError(format!("{e}"))),
        Err(e) => Err(ConfigError(format!("cannot read {}: {e}", path.display()))),
    }
}

impl S3Config {
    /// Resolves the settings from `overrides`, the process's environment
    /// and the AWS files.
    pub fn resolve(overrides: &Overrides) -> Result<S3Config, ConfigError> {
        S3Config::resolve_with(overrides, &ProcessEnv)
    }

    /// [`S3Config::resolve`] with the environment `env`.
    pub fn resolve_with(overrides: &Overrides, env: &dyn Env) -> Result<S3Config, ConfigError> {
        let named = overrides.profile.clone().or_else(|| env.var("AWS_PROFILE"));
        let profile = Profile::load(env, named.as_deref().unwrap_or("default"))?;
        if let Some(name) = &overrides.profile {
            if !profile.exists() {
                return Err(ConfigError(format!(
                    "profile {name:?} is in neither the credentials nor the config file"
                )));
            }
        }
        let (credentials, credentials_source) = match &overrides.credentials {
            Some(c) => (c.clone(), "given".to_owned()),
            None => match (overrides.profile.is_none(), from_env(env)) {
                (true, Some(c)) => (c, "environment".to_owned()),
                _ => from_profile(&profile)?,
            },
        };
        let region = overrides
            .region
            .clone()
            .or_else(|| env.var("AWS_REGION"))
            .or_else(|| env.var("AWS_DEFAULT_REGION"))
            .or_else(|| profile.get("region").map(str::to_owned))
            .unwrap_or_else(|| "us-east-1".to_owned());
        let endpoint = overrides
            .endpoint
            .clone()
            .or_else(|| env.var("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env.var("AWS_ENDPOINT_URL"))
            .or_else(|| profile.get("endpoint_url").map(str::to_owned))
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError(format!(
                "the endpoint {endpoint:?} is not an http:// or https:// URL"
            )));
        }
        Ok(S3Config {
            endpoint,
            region,
            credentials,
            credentials_source,
        })
    }
}

fn from_env(env: &dyn Env) -> Option<Credentials> {
    Some(Credentials {
        access_key_id: env.var("AWS_ACCESS_KEY_ID")?,
        secret_access_key: env.var("AWS_SECRET_ACCESS_KEY")?,
        session_token: env.var("AWS_SESSION_TOKEN"),
    })
}

fn from_profile(profile: &Profile) -> Result<(Credentials, String), ConfigError> {
    let (Some(access_key_id), Some(secret_access_key)) = (
        profile.get("aws_access_key_id"),
        profile.get("aws_secret_access_key"),
    ) else {
        return Err(ConfigError(format!(
            "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and profile {:?} has no aws_access_key_id and aws_secret_access_key (role and SSO profiles are not followed)",
            profile.name
        )));
    };
    let file = match &profile.credentials {
        Some((keys, path)) if keys.contains_key("aws_access_key_id") => path.clone(),
        _ => profile.config_path.clone(),
    };
    Ok((
        Credentials {
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret_access_key.to_owned(),
            session_token: profile.get("aws_session_token").map(str::to_owned),
        },
        format!("profile {} in {}", profile.name, file.display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TestEnv {
        vars: HashMap<&'static str, String>,
        home: PathBuf,
    }

    impl Env for TestEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.vars.get(name).cloned().filter(|v| !v.is_empty())
        }
        fn home(&self) -> Option<PathBuf> {
            Some(self.home.clone())
        }
    }

    fn home_with(credentials: &str, config: &str) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::write(dir.path().join(".aws/credentials"), credentials).unwrap();
        std::fs::write(dir.path().join(".aws/config"), config).unwrap();
        dir
    }

    mod tempdir {
        use std::path::{Path, PathBuf};
        use std::sync::atomic::{AtomicU32, Ordering};

        pub struct Dir(PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "hipobj-s3config-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }
            pub fn path(&self) -> &Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn env(home: &Path, vars: &[(&'static str, &str)]) -> TestEnv {
        TestEnv {
            vars: vars.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            home: home.to_owned(),
        }
    }

    const CREDENTIALS: &str = "\
# keys
[default]
aws_access_key_id = AKDEFAULT
aws_secret_access_key = secret-default ; inline comment

[work]
aws_access_key_id=AKWORK
aws_secret_access_key=secret-work
aws_session_token = token-work
";

    const CONFIG: &str = "\
[default]
region = eu-west-3
s3 =
  endpoint_url = http://not-this:1
  addressing_style = path

[profile work]
region = ap-south-1
endpoint_url = http://work.example:9000/

[profile keys-in-config]
aws_access_key_id = AKCONFIG
aws_secret_access_key = secret-config

[profile role]
role_arn = arn:aws:iam::123456789012:role/r
source_profile = default
";

    #[test]
    fn the_environment_comes_before_the_default_profile() {
        let home = home_with(CREDENTIALS, CONFIG);
        let e = env(
            home.path(),
            &[
                ("AWS_ACCESS_KEY_ID", "AKENV"),
                ("AWS_SECRET_ACCESS_KEY", "secret-env"),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ],
        );
        let c = S3Config::resolve_with(&Overrides::default(), &e).unwrap();
        assert_eq!(c.credentials.access_key_id, "AKENV");
        assert_eq!(c.credentials_source, "environment");
        assert_eq!(c.region, "eu-west-3", "the default profile's region");
        assert_eq!(c.endpoint, "http://127.0.0.1:9000");
    }

    #[test]
    fn a_named_profile_wins_over_the_environment_and_takes_its_own_settings() {
        let home = home_with(CREDENTIALS, CONFIG);
        let e = env(
            home.path(),
            &[
                ("AWS_ACCESS_KEY_ID", "AKENV"),
                ("AWS_SECRET_ACCESS_KEY", "secret-env"),
            ],
        );
        let o = Overrides {
            profile: Some("work".into()),
            ..Overrides::default()
        };
        let c = S3Config::resolve_with(&o, &e).unwrap();
        assert_eq!(c.credentials.access_key_id, "AKWORK");
        assert_eq!(c.credentials.session_token.as_deref(), Some("token-work"));
        assert_eq!(c.region, "ap-south-1");
        assert_eq!(c.endpoint, "http://work.example:9000", "no trailing slash");
        assert!(c.credentials_source.starts_with("profile work in "));
    }

    #[test]
    fn aws_profile_names_the_profile_and_keys_may_sit_in_the_config_file() {
        let home = home_with(CREDENTIALS, CONFIG);
        let e = env(home.path(), &[("AWS_PROFILE", "keys-in-config")]);
        let c = S3Config::resolve_with(&Overrides::default(), &e).unwrap();
        assert_eq!(c.credentials.secret_access_key, "secret-config");
        assert_eq!(c.endpoint, "https://s3.us-east-1.amazonaws.com");
    }

    #[test]
    fn defaults_come_from_the_default_profile_and_skip_sub_sections() {
        let home = home_with(CREDENTIALS, CONFIG);
        let c = S3Config::resolve_with(&Overrides::default(), &env(home.path(), &[])).unwrap();
        assert_eq!(c.credentials.access_key_id, "AKDEFAULT");
        assert_eq!(c.credentials.secret_access_key, "secret-default");
        assert_eq!(
            c.endpoint, "https://s3.eu-west-3.amazonaws.com",
            "the s3 sub-section's endpoint is not the profile's"
        );
    }

    #[test]
    fn given_settings_come_first() {
        let home = home_with(CREDENTIALS, CONFIG);
        let o = Overrides {
            endpoint: Some("https://x.example".into()),
            region: Some("r1".into()),
            credentials: Some(Credentials {
                access_key_id: "AKGIVEN".into(),
                secret_access_key: "s".into(),
                session_token: None,
            }),
            profile: None,
        };
        let e = env(
            home.path(),
            &[("AWS_REGION", "r2"), ("AWS_ACCESS_KEY_ID", "x")],
        );
        let c = S3Config::resolve_with(&o, &e).unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.region.as_str()),
            ("https://x.example", "r1")
        );
        assert_eq!(c.credentials.access_key_id, "AKGIVEN");
    }

    #[test]
    fn missing_keys_a_missing_profile_and_a_bad_endpoint_are_clear_errors() {
        let home = home_with("", "");
        let none = S3Config::resolve_with(&Overrides::default(), &env(home.path(), &[]));
        assert!(none.unwrap_err().0.contains("no credentials"));
        let home = home_with(CREDENTIALS, CONFIG);
        let o = Overrides {
            profile: Some("nope".into()),
            ..Overrides::default()
        };
        let e = S3Config::resolve_with(&o, &env(home.path(), &[])).unwrap_err();
        assert!(e.0.contains("\"nope\""), "{e}");
        let o = Overrides {
            profile: Some("role".into()),
            ..Overrides::default()
        };
        let e = S3Config::resolve_with(&o, &env(home.path(), &[])).unwrap_err();
        assert!(e.0.contains("role and SSO profiles"), "{e}");
        let o = Overrides {
            endpoint: Some("ftp://x".into()),
            ..Overrides::default()
        };
        let e = S3Config::resolve_with(&o, &env(home.path(), &[])).unwrap_err();
        assert!(e.0.contains("not an http"), "{e}");
    }

    #[test]
    fn debug_output_never_shows_the_secret() {
        let c = Credentials {
            access_key_id: "AKID".into(),
            secret_access_key: "very-secret".into(),
            session_token: Some("session-secret".into()),
        };
        let text = format!("{c:?}");
        assert!(text.contains("AKID") && !text.contains("secret-") && !text.contains("very"));
    }
}
