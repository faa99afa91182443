//! Applying a file's keys to options: the command line's flags stay, every
//! option the file sets remembers its key and line, and the keys that
//! mean something only together (alignment, the restart strategy's
//! families) are checked once all are read.

use super::keys::{key, Problem};
use super::options::{Mode, Options};
use super::{ConfigError, ConfigFile, Located, Origins};
use std::time::Duration;

/// Sets options from a file's keys, key by key, remembering which key set
/// each option so that errors name it.
pub(super) struct Applier<'a> {
    options: &'a mut Options,
    origins: Origins,
    /// Whether the command line gave the option's flag, which then wins.
    given: &'a dyn Fn(&str) -> bool,
    /// The key being applied, as the file spells it.
    at: Located,
    /// The canonical names of the keys read so far, with where.
    seen: Vec<(&'static str, Located)>,
    /// Flink's two alignment keys, which mean something only together.
    unaligned: Option<(bool, Located)>,
    aligned_timeout: Option<(Duration, Located)>,
    /// Flink's `restart-strategy.type`, which its families' keys must match.
    restart_type: Option<&'static str>,
}

impl Applier<'_> {
    /// Sets `option` with `write`, unless its flag was given; a second key
    /// setting the same option is a conflict.
    pub(super) fn set(
        &mut self,
        option: &'static str,
        write: impl FnOnce(&mut Options),
    ) -> Result<(), Problem> {
        if (self.given)(option) {
            return Ok(());
        }
        if let Some(earlier) = self.origins.set.get(option) {
            return Err(Problem::Conflict(earlier.clone()));
        }
        write(self.options);
        self.origins.set.insert(option, self.at.clone());
        Ok(())
    }

    /// `execution.checkpointing.unaligned.enabled`, resolved with the
    /// timeout once every key is read.
    pub(super) fn unaligned(&mut self, enabled: bool) {
        self.unaligned = Some((enabled, self.at.clone()));
    }

    /// `execution.checkpointing.aligned-checkpoint-timeout`, resolved with
    /// `unaligned.enabled` once every key is read.
    pub(super) fn aligned_timeout(&mut self, timeout: Duration) {
        self.aligned_timeout = Some((timeout, self.at.clone()));
    }

    /// `restart-strategy.type`, checked against the families' keys once
    /// every key is read.
    pub(super) fn restart_type(&mut self, kind: &'static str) {
        self.restart_type = Some(kind);
    }

    /// Flink's alignment keys together: unaligned checkpoints, which with a
    /// positive `aligned-checkpoint-timeout` start aligned and switch after
    /// it. Either of `--mode` and `--aligned-timeout` replaces both keys.
    fn resolve_alignment(&mut self) -> Result<(), (Located, String)> {
        let (unaligned, timeout) = (self.unaligned.take(), self.aligned_timeout.take());
        if (self.given)("mode") || (self.given)("aligned_timeout") {
            return Ok(());
        }
        if let Some((_, at)) = timeout
            .as_ref()
            .filter(|_| !matches!(unaligned, Some((true, _))))
        {
            return Err((
                at.clone(),
                "applies only with execution.checkpointing.unaligned.enabled: true".into(),
            ));
        }
        if let Some((enabled, at)) = unaligned {
            let switch = timeout.as_ref().filter(|(t, _)| enabled && !t.is_zero());
            self.options.mode = match switch {
                Some(_) => Mode::Aligned,
                None if enabled => Mode::Unaligned,
                None => Mode::Aligned,
            };
            self.options.aligned_timeout = switch.map(|(t, _)| *t);
            self.origins.set.insert("mode", at);
            if let Some((_, at)) = timeout {
                self.origins.set.insert("aligned_timeout", at);
            }
        }
        Ok(())
    }

    /// A `fixed-delay.*` or `exponential-delay.*` key belongs to its type;
    /// under another one Flink ignores it, Tidemark refuses it.
    fn check_restart_keys(&self) -> Result<(), (Located, String)> {
        let kind = self
            .restart_type
            .unwrap_or(match self.options.restart_backoff {
                false => "fixed-delay",
                true => "exponential-delay",
            });
        for at in self.origins.set.values() {
            let family = key(&at.key)
                .and_then(|k| k.name.strip_prefix("restart-strategy."))
                .and_then(|rest| rest.split_once('.'))
                .map(|(family, _)| family);
            if let Some(family) = family.filter(|f| *f != kind) {
                return Err((
                    at.clone(),
                    format!(
                        "applies to restart-strategy.type: {family}, and the restart strategy is {kind}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl ConfigFile {
    /// Sets `options` from this file's keys, except those whose option
    /// `given` says the command line set. Returns which key set each
    /// option; `options` must not be used after an error.
    pub fn apply(
        &self,
        options: &mut Options,
        given: impl Fn(&str) -> bool,
    ) -> Result<Origins, ConfigError> {
        let path = || self.path.clone();
        let mut applier = Applier {
            options,
            origins: Origins {
                file: Some(self.path.clone()),
                set: Default::default(),
            },
            given: &given,
            at: Located::default(),
            seen: Vec::new(),
            unaligned: None,
            aligned_timeout: None,
            restart_type: None,
        };
        for entry in &self.entries {
            let Some(key) = key(&entry.key) else {
                return Err(ConfigError::UnknownKey {
                    path: path(),
                    line: entry.line,
                    key: entry.key.clone(),
                });
            };
            let at = Located {
                key: entry.key.clone(),
                line: entry.line,
            };
            let earlier = applier.seen.iter().find(|(name, _)| *name == key.name);
            let applied = match earlier {
                Some((_, earlier)) => Err(Problem::Conflict(earlier.clone())),
                None => {
                    applier.at = at.clone();
                    (key.apply)(&mut applier, &entry.value)
                }
            };
            applied.map_err(|problem| match problem {
                Problem::Value(problem) => ConfigError::BadValue {
                    path: path(),
                    line: at.line,
                    key: at.key.clone(),
                    problem,
                },
                Problem::Conflict(earlier) => ConfigError::Conflict {
                    path: path(),
                    line: at.line,
                    key: at.key.clone(),
                    other: earlier.key,
                    other_line: earlier.line,
                },
            })?;
            applier.seen.push((key.name, at));
        }
        let checks = applier
            .resolve_alignment()
            .and_then(|()| applier.check_restart_keys());
        checks.map_err(|(at, problem)| ConfigError::BadValue {
            path: path(),
            line: at.line,
            key: at.key,
            problem,
        })?;
        Ok(applier.origins)
    }
}
