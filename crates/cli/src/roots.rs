//! `tidemark worker --root`: where the jobs a worker hosts may keep their
//! checkpoints, savepoints, state and output. A worker's callers send the
//! job's command line; the roots are the worker's own, so a caller cannot
//! make it write, or restore from, anywhere else.

/// The locations a worker allows, each a path (made absolute) or a URL
/// (`s3://bucket/prefix`, `postgres://host/db`, …) without credentials or
/// query. None: every location is allowed.
#[derive(Clone, Debug, Default)]
pub struct Roots(Vec<String>);

/// Why a location is outside the roots, or cannot be placed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    /// A location that is in none of the roots.
    #[error("{flag} {location} is outside this worker's roots ({roots}); start the worker with --root covering it")]
    Outside {
        /// The flag or key that named it.
        flag: &'static str,
        /// As given.
        location: String,
        /// The worker's roots, comma separated.
        roots: String,
    },
    /// A relative path, with no working directory to resolve it against.
    #[error("{0} is relative and the working directory is unknown")]
    NoWorkingDirectory(String),
}

impl Roots {
    /// The roots `given`, paths resolved against the working directory.
    pub fn new(given: &[String]) -> Result<Self, RootError> {
        given
            .iter()
            .map(|root| normalize(root))
            .collect::<Result<_, _>>()
            .map(Roots)
    }

    /// Whether `location`, named by `flag`, is inside a root.
    pub fn check(&self, flag: &'static str, location: &str) -> Result<(), RootError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let location_key = normalize(location)?;
        let inside = |root: &String| {
            location_key == *root
                || location_key
                    .strip_prefix(root.as_str())
                    .is_some_and(|rest| root.ends_with('/') || rest.starts_with('/'))
        };
        if self.0.iter().any(inside) {
            return Ok(());
        }
        Err(RootError::Outside {
            flag,
            location: location.to_owned(),
            roots: self.0.join(", "),
        })
    }
}

/// `location` as roots compare it: a URL without credentials, query or
/// trailing slash; a path (`file://` included) absolute, with `.` and `..`
/// resolved without following links.
fn normalize(location: &str) -> Result<String, RootError> {
    let path = location.strip_prefix("file://").unwrap_or(location);
    if let Some((scheme, rest)) = path.split_once("://") {
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let rest = match rest.split_once('/') {
            Some((authority, path)) => format!("{}/{path}", without_userinfo(authority)),
            None => without_userinfo(rest).to_owned(),
        };
        return Ok(format!("{scheme}://{}", rest.trim_end_matches('/')));
    }
    let path = std::path::Path::new(path);
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map_err(|_| RootError::NoWorkingDirectory(location.to_owned()))?
            .join(path)
    };
    let mut resolved = std::path::PathBuf::from("/");
    for part in absolute.components() {
        match part {
            std::path::Component::ParentDir => {
                resolved.pop();
            }
            std::path::Component::Normal(name) => resolved.push(name),
            _ => {}
        }
    }
    Ok(resolved.to_string_lossy().into_owned())
}

fn without_userinfo(authority: &str) -> &str {
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(given: &[&str]) -> Roots {
        Roots::new(&given.iter().map(|r| r.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_location_is_inside_a_root_only_below_it() {
        let roots = roots(&[
            "/data/jobs",
            "s3://bucket/tidemark/",
            "postgres://db:5432/results",
        ]);
        for inside in [
            "/data/jobs",
            "/data/jobs/checkpoints",
            "file:///data/jobs/out",
            "/data/other/../jobs/x",
            "s3://bucket/tidemark/checkpoints",
            "postgres://writer:secret@db:5432/results?table=counts",
        ] {
            assert_eq!(roots.check("--output", inside), Ok(()), "{inside}");
        }
        for outside in [
            "/data/jobsx",
            "/data/jobs/../../etc",
            "/etc/cron.d",
            "s3://bucket/tidemarkx",
            "s3://other/tidemark",
            "postgres://db:5432/resultsx",
            "memory://",
        ] {
            let err = roots.check("--output", outside).unwrap_err();
            assert!(
                matches!(&err, RootError::Outside { flag: "--output", location, .. } if location == outside),
                "{outside}: {err}"
            );
        }
    }

    #[test]
    fn without_roots_everything_is_allowed_and_relative_paths_resolve_here() {
        assert_eq!(Roots::default().check("--state-dir", "/anywhere"), Ok(()));
        let here = std::env::current_dir().unwrap();
        let roots = roots(&["jobs"]);
        let inside = here.join("jobs/chk").to_string_lossy().into_owned();
        assert_eq!(roots.check("--checkpoint-dir", &inside), Ok(()));
        assert_eq!(roots.check("--checkpoint-dir", "jobs/./chk"), Ok(()));
        assert!(roots.check("--checkpoint-dir", "elsewhere").is_err());
    }
}
