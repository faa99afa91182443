//! Configuration files: a job's settings in YAML, with Flink's key names
//! where Flink has the setting and `tidemark.…` keys otherwise, so that a
//! Flink `config.yaml` reads as it reads in Flink or is refused with the
//! reason. Keys may be flat (`execution.checkpointing.interval: 1 s`) or
//! nested maps, whose names join with `.`. Values take Flink's formats:
//! durations such as `1 s` or `500ms` up to a year (a bare number is
//! milliseconds), sizes such as `32 mb` in binary units (a bare number is
//! bytes), `true`/`false`.
//!
//! An embedding application reads a file into the embedding API's settings:
//!
//! ```no_run
//! # fn main() -> Result<(), tidemark_cli::config::ConfigError> {
//! let config = tidemark_cli::config::load("tidemark.yaml")?;
//! // Job::builder("words").config(config) ...
//! # Ok(()) }
//! ```
//!
//! The `tidemark run --config FILE` command reads the same file through
//! [`ConfigFile::apply`], under the flags given on its command line.

mod apply;
mod keys;
mod options;
#[cfg(test)]
mod tests;
pub mod values;

pub use options::{CheckpointInterval, HaType, Mode, Options, Refusal, RestoreArg, StateKind};

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;
use tidemark_core::job::JobConfig;

/// Reads the configuration file at `path` into the settings it gives a
/// job, over the defaults of `tidemark run`'s flags; unknown keys, bad
/// values and settings that do not work together are errors.
pub fn load(path: impl AsRef<Path>) -> Result<JobConfig, ConfigError> {
    let file = ConfigFile::read(path)?;
    let mut options = Options::default();
    let origins = file.apply(&mut options, |_| false)?;
    options
        .validate(&origins)
        .map_err(|refusal| origins.refused(refusal))?;
    if let Some(RestoreArg::Checkpoint {
        parent: Some(_), ..
    }) = &options.restore
    {
        // `tidemark run` checks the path against the job's directory; here
        // the job's name, and so its directory, is not known yet.
        return Err(origins.refused(Refusal {
            option: "restore",
            problem: "give chk-N alone: a job restores a checkpoint from its own directory in checkpoint storage".into(),
        }));
    }
    Ok(options.job_config())
}

/// A configuration file that could not be used. Every error names the file
/// and, past reading it, the line and the key.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML, or not a map of keys to values.
    #[error("{}:{line}: {problem}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where the problem is, from 1.
        line: usize,
        /// What it is.
        problem: String,
    },
    /// A key Tidemark does not know.
    #[error("{}:{line}: unknown key {key}", path.display())]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key's line, from 1.
        line: usize,
        /// The key, its nested names joined with `.`.
        key: String,
    },
    /// A value that does not read, or a setting that cannot be honoured.
    #[error("{}:{line}: {key}: {problem}", path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key's line, from 1.
        line: usize,
        /// The key.
        key: String,
        /// What is wrong with its value.
        problem: String,
    },
    /// Two keys that set the same thing, such as a key and its deprecated
    /// name.
    #[error("{}:{line}: {key} sets what {other} (line {other_line}) sets", path.display())]
    Conflict {
        /// The file.
        path: PathBuf,
        /// The later key's line, from 1.
        line: usize,
        /// The later key.
        key: String,
        /// The earlier key.
        other: String,
        /// The earlier key's line.
        other_line: usize,
    },
}

/// Where a file sets an option: the key as the file spells it, and its line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Located {
    /// The key, its nested names joined with `.`.
    pub key: String,
    /// From 1.
    pub line: usize,
}

/// Which options a configuration file set, so that a message names each as
/// the user gave it: as a key of the file, or as a flag.
#[derive(Clone, Debug, Default)]
pub struct Origins {
    file: Option<PathBuf>,
    set: BTreeMap<&'static str, Located>,
}

impl Origins {
    /// The option as the user gave it: `key (FILE:LINE)` if the file set
    /// it, else its flag.
    pub fn name(&self, option: &str) -> String {
        match (&self.file, self.set.get(option)) {
            (Some(file), Some(at)) => format!("{} ({}:{})", at.key, file.display(), at.line),
            _ => format!("--{}", option.replace('_', "-")),
        }
    }

    /// Where the file set `option`, if it did.
    pub fn located(&self, option: &str) -> Option<&Located> {
        self.set.get(option)
    }

    /// How to change a setting: the flag, and the key too if a file is in
    /// use.
    pub fn suggest(&self, flag: &str, key: &str) -> String {
        match self.file {
            Some(_) => format!("{flag} or {key}"),
            None => flag.to_owned(),
        }
    }

    /// A refused option of a file as an error naming its key.
    pub fn refused(&self, refusal: Refusal) -> ConfigError {
        let at = self
            .set
            .get(refusal.option)
            .cloned()
            .unwrap_or_else(|| Located {
                key: self.name(refusal.option),
                line: 0,
            });
        ConfigError::BadValue {
            path: self.file.clone().unwrap_or_default(),
            line: at.line,
            key: at.key,
            problem: refusal.problem,
        }
    }
}

/// One `key: value` of a file, nested names joined.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    key: String,
    value: String,
    line: usize,
}

/// A configuration file read into flat keys, each with the text of its
/// value (read by the key's own parser, as Flink reads every value as
/// text) and its line.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    path: PathBuf,
    entries: Vec<Entry>,
}

impl ConfigFile {
    /// Reads and flattens the file at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<ConfigFile, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        ConfigFile::parse(path, &text)
    }

    /// Flattens `text`, the contents of the file at `path`.
    pub fn parse(path: impl AsRef<Path>, text: &str) -> Result<ConfigFile, ConfigError> {
        let path = path.as_ref().to_owned();
        let syntax = |line, problem: String| ConfigError::Syntax {
            path: path.clone(),
            line,
            problem,
        };
        let documents = MarkedYaml::load_from_str(text)
            .map_err(|e| syntax(e.marker().line(), format!("not YAML: {}", e.info())))?;
        let mut entries = Vec::new();
        match &documents[..] {
            [] => {}
            [root] => {
                match &root.data {
                    YamlData::Mapping(map) => flatten(&path, "", map, &mut entries)?,
                    YamlData::Value(Scalar::Null) => {}
                    _ => return Err(syntax(
                        root.span.start.line(),
                        "expected keys and values, such as `execution.checkpointing.interval: 1 s`"
                            .into(),
                    )),
                }
            }
            [_, second, ..] => {
                return Err(syntax(
                    second.span.start.line(),
                    "expected one YAML document".into(),
                ))
            }
        }
        Ok(ConfigFile { path, entries })
    }
}

/// Appends the keys of `map` under `prefix`, each with its value's text.
fn flatten(
    path: &Path,
    prefix: &str,
    map: &saphyr::AnnotatedMapping<'_, MarkedYaml<'_>>,
    out: &mut Vec<Entry>,
) -> Result<(), ConfigError> {
    for (name, value) in map {
        let line = name.span.start.line();
        let key = match scalar_text(name) {
            Some(name) if prefix.is_empty() => name,
            Some(name) => format!("{prefix}.{name}"),
            None => {
                return Err(ConfigError::Syntax {
                    path: path.to_owned(),
                    line,
                    problem: "a key must be a name".into(),
                })
            }
        };
        let bad = |problem: &str| ConfigError::BadValue {
            path: path.to_owned(),
            line,
            key: key.clone(),
            problem: problem.into(),
        };
        match &value.data {
            YamlData::Mapping(inner) => flatten(path, &key, inner, out)?,
            YamlData::Value(Scalar::Null) => return Err(bad("has no value")),
            YamlData::Sequence(_) => return Err(bad("takes one value, not a list")),
            _ => match scalar_text(value) {
                Some(text) => out.push(Entry {
                    key,
                    value: text,
                    line,
                }),
                None => return Err(bad("takes one plain value")),
            },
        }
    }
    Ok(())
}

/// The text of a scalar as written, for the key's parser to read; `None`
/// for anything else.
fn scalar_text(node: &MarkedYaml<'_>) -> Option<String> {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Integer(n)) => Some(n.to_string()),
        YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        _ => None,
    }
}
