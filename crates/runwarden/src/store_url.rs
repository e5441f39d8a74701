//! `[store] url`: which backend holds the data, as `sqlite:PATH` or
//! `postgres://...`, with typed errors that say what to write. A PostgreSQL URL's password
//! is never shown: `Debug`, `Display` and every error print the URL with it replaced.

use std::fmt;
use std::path::{Path, PathBuf};

/// What to write, repeated in every error.
const WRITE: &str = "write sqlite:PATH or postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE";

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    /// The embedded SQLite file (the default: `<data_dir>/runwarden.db`).
    Sqlite(PathBuf),
    /// A PostgreSQL database that many nodes may share.
    Postgres(PostgresUrl),
}

impl StoreUrl {
    /// Parses `text`; a relative SQLite path goes through `resolve` (relative to the
    /// configuration file, like every other path).
    pub(crate) fn parse(
        text: &str,
        resolve: impl Fn(PathBuf) -> PathBuf,
    ) -> Result<Self, StoreUrlError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(StoreUrlError::Empty);
        }
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(StoreUrlError::no_scheme(text));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => sqlite(rest, resolve),
            "postgres" | "postgresql" => PostgresUrl::parse(text).map(Self::Postgres),
            // `C:\...` or a path with a colon in it: no scheme was meant.
            _ if scheme.contains(['/', '\\', '.']) || scheme.len() == 1 => {
                Err(StoreUrlError::no_scheme(text))
            }
            other => Err(StoreUrlError::UnsupportedScheme {
                scheme: other.chars().take(32).collect(),
            }),
        }
    }

    /// The SQLite file, when the store is SQLite.
    pub(crate) fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Self::Sqlite(path) => Some(path),
            Self::Postgres(_) => None,
        }
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Postgres(url) => url.fmt(f),
        }
    }
}

fn sqlite(rest: &str, resolve: impl Fn(PathBuf) -> PathBuf) -> Result<StoreUrl, StoreUrlError> {
    // `sqlite:///abs/file.db` and `sqlite://rel.db` as other tools write them.
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.contains('?') {
        return Err(StoreUrlError::SqliteQuery);
    }
    if path == ":memory:" || path.is_empty() && rest.starts_with("//") {
        return Err(StoreUrlError::SqliteMemory);
    }
    if path.is_empty() {
        return Err(StoreUrlError::SqliteNoPath);
    }
    Ok(StoreUrl::Sqlite(resolve(PathBuf::from(path))))
}

/// A PostgreSQL connection URL. The password stays inside: [`PostgresUrl::expose`] hands the
/// whole URL to the driver, everything else sees [`fmt::Display`] with it replaced.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PostgresUrl {
    url: String,
    shown: String,
}

impl PostgresUrl {
    fn parse(text: &str) -> Result<Self, StoreUrlError> {
        let parsed = url::Url::parse(text).map_err(|e| match e {
            url::ParseError::EmptyHost => StoreUrlError::PostgresNoHost,
            // The parser's message never repeats the input, so it cannot carry a password.
            e => StoreUrlError::PostgresInvalid {
                reason: e.to_string(),
            },
        })?;
        let shown = redact(&parsed);
        let socket_in_query = parsed.query_pairs().any(|(k, _)| k == "host");
        if parsed.host_str().is_none_or(str::is_empty) && !socket_in_query {
            return Err(StoreUrlError::PostgresNoHost);
        }
        Ok(Self {
            url: text.to_string(),
            shown,
        })
    }

    /// The URL with its password, for the PostgreSQL driver alone.
    pub(crate) fn expose(&self) -> &str {
        &self.url
    }
}

/// The URL with the password (in the userinfo or as `?password=`) replaced by `***`.
fn redact(url: &url::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    if shown.query_pairs().any(|(k, _)| k == "password") {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" {
                    "***".to_string()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        shown.query_pairs_mut().clear().extend_pairs(pairs);
    }
    shown.to_string()
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PostgresUrl").field(&self.shown).finish()
    }
}

/// Why a store URL was refused; each message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StoreUrlError {
    /// Nothing was given.
    #[error("the store URL is empty: {WRITE}")]
    Empty,
    /// A bare path, without `sqlite:`.
    #[error(
        "the store URL {path:?} has no scheme: write sqlite:{path} for a SQLite file, or postgres://USER@HOST/DATABASE"
    )]
    NoScheme {
        /// What was given (it has no scheme, so no userinfo to hide).
        path: String,
    },
    /// A scheme we have no backend for.
    #[error("store URLs with scheme {scheme:?} are not supported: {WRITE}")]
    UnsupportedScheme {
        /// The scheme alone: the rest may hold a password.
        scheme: String,
    },
    /// `sqlite:` with nothing after it.
    #[error(
        "sqlite: needs a file path: write sqlite:/var/lib/runwarden/runwarden.db or sqlite:PATH relative to the configuration file"
    )]
    SqliteNoPath,
    /// An in-memory database, which other processes cannot share.
    #[error(
        "an in-memory SQLite database cannot be shared by runwarden's processes: write sqlite:PATH with a file path"
    )]
    SqliteMemory,
    /// `sqlite:PATH?...`.
    #[error(
        "sqlite:PATH takes no query parameters: runwarden sets WAL, the busy timeout and the rest itself"
    )]
    SqliteQuery,
    /// A `postgres://` URL the parser refused.
    #[error("the PostgreSQL URL is not valid ({reason}): {WRITE}")]
    PostgresInvalid {
        /// The parser's reason.
        reason: String,
    },
    /// A `postgres://` URL with no host (and no `?host=` socket directory).
    #[error(
        "the PostgreSQL URL names no host: write postgres://USER@HOST/DATABASE, or add ?host=/run/postgresql for a socket directory"
    )]
    PostgresNoHost,
}

impl StoreUrlError {
    /// A text without a scheme is echoed only when it cannot hold userinfo.
    fn no_scheme(text: &str) -> Self {
        let path = if text.contains('@') { "PATH" } else { text };
        Self::NoScheme {
            path: path.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<StoreUrl, StoreUrlError> {
        StoreUrl::parse(text, |p| Path::new("/etc/runwarden").join(p))
    }

    const SIGIL: &str = "sigil-5f0c2e91-DO-NOT-PRINT";

    #[test]
    fn sqlite_urls_name_a_file_relative_to_the_configuration() {
        for (text, path) in [
            ("sqlite:data/rw.db", "/etc/runwarden/data/rw.db"),
            ("sqlite:/var/lib/rw.db", "/var/lib/rw.db"),
            ("sqlite:///var/lib/rw.db", "/var/lib/rw.db"),
            ("sqlite://rw.db", "/etc/runwarden/rw.db"),
            ("SQLite:rw.db", "/etc/runwarden/rw.db"),
        ] {
            assert_eq!(
                parse(text).unwrap(),
                StoreUrl::Sqlite(PathBuf::from(path)),
                "{text}"
            );
        }
    }

    #[test]
    fn postgres_urls_are_kept_whole_for_the_driver() {
        for text in [
            "postgres://rw@db.internal/runwarden",
            "postgresql://rw:pw@10.0.0.5:5433/runwarden?sslmode=require",
            "postgres:///runwarden?host=/run/postgresql",
        ] {
            match parse(text).unwrap() {
                StoreUrl::Postgres(url) => assert_eq!(url.expose(), text),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_store_urls_get_typed_errors_that_say_what_to_write() {
        for (text, expected) in [
            ("", StoreUrlError::Empty),
            ("  ", StoreUrlError::Empty),
            (
                "/var/lib/rw.db",
                StoreUrlError::NoScheme {
                    path: "/var/lib/rw.db".into(),
                },
            ),
            (
                "mysql://rw@db/runwarden",
                StoreUrlError::UnsupportedScheme {
                    scheme: "mysql".into(),
                },
            ),
            ("sqlite:", StoreUrlError::SqliteNoPath),
            ("sqlite::memory:", StoreUrlError::SqliteMemory),
            ("sqlite://", StoreUrlError::SqliteMemory),
            ("sqlite:rw.db?mode=rwc", StoreUrlError::SqliteQuery),
            ("postgres://rw@/runwarden", StoreUrlError::PostgresNoHost),
            ("postgres:///runwarden", StoreUrlError::PostgresNoHost),
        ] {
            let error = parse(text).unwrap_err();
            assert_eq!(error, expected, "{text:?}");
            let message = error.to_string();
            assert!(
                message.contains("write") || message.contains("runwarden sets"),
                "{text:?}: {message}"
            );
        }
        assert!(matches!(
            parse("postgres://rw@[::1/runwarden"),
            Err(StoreUrlError::PostgresInvalid { .. })
        ));
    }

    #[test]
    fn a_postgres_password_never_appears_in_display_debug_or_errors() {
        let good = format!("postgres://rw:{SIGIL}@db.internal:5432/runwarden?password={SIGIL}");
        let url = parse(&good).unwrap();
        for shown in [url.to_string(), format!("{url:?}")] {
            assert!(!shown.contains(SIGIL), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        for bad in [
            format!("postgres://rw:{SIGIL}@/runwarden"),
            format!("postgres://rw:{SIGIL}@[::1/runwarden"),
            format!("mysql://rw:{SIGIL}@db/runwarden"),
            format!("rw:{SIGIL}@db/runwarden"),
            format!("my.user:{SIGIL}@db/runwarden"),
            format!("/rw:{SIGIL}@db"),
        ] {
            let error = parse(&bad).unwrap_err();
            for shown in [error.to_string(), format!("{error:?}")] {
                assert!(!shown.contains(SIGIL), "{bad}: {shown}");
            }
        }
    }
}
