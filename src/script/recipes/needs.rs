//! What a recipe may do beyond reading, as its header's `// needs: …` line declares it, in
//! the words of `gpuloop mcp --allow`: checked against a server's permissions before the
//! recipe runs, and enforced while it runs by the script functions that act (`Powers`), so a
//! recipe does no more than it declared.
//!
//! ```text
//! // needs: clean           stops the GPUs' holders it finds itself, resets GPUs
//! // needs: kill            stops processes its caller names
//! // needs: run             runs commands or writes files (as root, the same power)
//! // needs: none            only reads
//! ```

use serde::Serialize;
use std::fmt;

/// One thing beyond reading that a recipe declares it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Need {
    /// Signals processes its caller names (MCP: `--allow kill`).
    Kill,
    /// Stops the holders of GPUs, and resets GPUs, choosing them itself (MCP: `--allow clean`,
    /// or `kill`, which may stop any process).
    Clean,
    /// Runs commands, or writes files (MCP: `--allow run`): either is any command as the
    /// user gpuloop runs as.
    Run,
}

impl Need {
    const ALL: [(Need, &'static str); 3] = [
        (Need::Kill, "kill"),
        (Need::Clean, "clean"),
        (Need::Run, "run"),
    ];

    pub fn name(self) -> &'static str {
        Need::ALL
            .iter()
            .find(|(n, _)| *n == self)
            .map_or("?", |(_, w)| w)
    }

    /// The `--allow` words of which any one lets a server run a recipe that needs this.
    pub fn allowed_by(self) -> &'static [&'static str] {
        match self {
            Need::Kill => &["kill"],
            Need::Clean => &["clean", "kill"],
            Need::Run => &["run"],
        }
    }

    /// One of `needs` that none of the `allowed` words permits, run before the others (it is
    /// the most a recipe can do).
    pub fn first_refused<'a>(
        needs: &[Need],
        allowed: impl Iterator<Item = &'a str> + Clone,
    ) -> Option<Need> {
        needs.iter().copied().rev().find(|n| {
            !n.allowed_by()
                .iter()
                .any(|w| allowed.clone().any(|a| a.trim().eq_ignore_ascii_case(w)))
        })
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `kill, run` (commas or spaces) or `none`: the needs it names, each once.
pub(crate) fn parse(list: &str) -> Result<Vec<Need>, String> {
    let words: Vec<&str> = list
        .split([',', ' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    if words == ["none"] {
        return Ok(Vec::new());
    }
    let mut needs = Vec::new();
    for w in words {
        let need = Need::ALL
            .iter()
            .find(|(_, n)| *n == w)
            .map(|(k, _)| *k)
            .ok_or_else(|| {
                format!("unknown need {w:?}: a recipe's `// needs:` line names kill, clean and run (what it does beyond reading, as `gpuloop mcp --allow` names them), or none")
            })?;
        if needs.contains(&need) {
            return Err(format!("{w} is named twice in `// needs:`"));
        }
        needs.push(need);
    }
    if needs.is_empty() {
        return Err("nothing after `needs:`: name kill, clean or run, or none".into());
    }
    needs.sort();
    Ok(needs)
}

/// `kill, run`, or `none`.
pub fn words(needs: &[Need]) -> String {
    if needs.is_empty() {
        return "none".into();
    }
    needs
        .iter()
        .map(|n| n.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a script function does that is more than reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// Sends signals (kill(), reset_gpu()).
    Signal,
    /// Runs a command or writes a file (run(), spawn(), write_file(), apply_patch(), …).
    Run,
}

/// What the script running may do: everything, or only what its header declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Powers {
    /// `None`: no limit (a script with no `needs` line, run by a person).
    declared: Option<[bool; 3]>,
}

impl Default for Powers {
    fn default() -> Self {
        Powers::ALL
    }
}

impl Powers {
    /// No limit: a script a person runs that declares nothing.
    pub const ALL: Powers = Powers { declared: None };

    /// Only what `needs` declares.
    pub fn only(needs: &[Need]) -> Powers {
        let mut declared = [false; 3];
        for n in needs {
            declared[*n as usize] = true;
        }
        Powers {
            declared: Some(declared),
        }
    }

    fn has(&self, n: Need) -> bool {
        self.declared.is_none_or(|d| d[n as usize])
    }

    /// Ok when the script may do `act`; else what `func` (`run()`) was refused, and why.
    pub(crate) fn check(&self, act: Act, func: &str) -> Result<(), String> {
        let (ok, does, need) = match act {
            Act::Signal => (
                self.has(Need::Clean) || self.has(Need::Kill),
                "signals processes",
                "clean (or kill)",
            ),
            Act::Run => (
                self.has(Need::Run),
                "runs a command or writes a file",
                "run",
            ),
        };
        if ok {
            return Ok(());
        }
        let declared: Vec<Need> = Need::ALL
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| self.has(*n))
            .collect();
        Err(format!(
            "{func} {does}, which this recipe may not do: its header declares `// needs: {}`; a recipe that does declares {need} there (and is then run over MCP only where the server allows it)",
            words(&declared)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_read_as_written_and_bad_words_are_named() {
        assert_eq!(parse("run, kill"), Ok(vec![Need::Kill, Need::Run]));
        assert_eq!(parse("clean"), Ok(vec![Need::Clean]));
        assert_eq!(parse(" none "), Ok(vec![]));
        assert!(parse("nuke").unwrap_err().contains("unknown need \"nuke\""));
        assert!(parse("run run").unwrap_err().contains("named twice"));
        assert!(parse("").is_err());
    }

    #[test]
    fn a_server_permits_a_need_by_its_own_words() {
        let allowed = |s: &'static str| s.split(',').filter(|w| !w.is_empty());
        let clean_run = [Need::Clean, Need::Run];
        assert_eq!(Need::first_refused(&clean_run, allowed("clean,run")), None);
        assert_eq!(Need::first_refused(&clean_run, allowed("kill,run")), None);
        assert_eq!(
            Need::first_refused(&clean_run, allowed("clean,recipes")),
            Some(Need::Run)
        );
        assert_eq!(
            Need::first_refused(&[Need::Kill], allowed("clean")),
            Some(Need::Kill)
        );
        assert_eq!(Need::first_refused(&[], allowed("")), None);
    }

    #[test]
    fn powers_refuse_what_was_not_declared() {
        assert!(Powers::ALL.check(Act::Run, "run()").is_ok());
        let p = Powers::only(&[Need::Clean]);
        assert!(p.check(Act::Signal, "kill()").is_ok());
        let e = p.check(Act::Run, "run()").unwrap_err();
        assert!(
            e.starts_with("run() runs a command or writes a file, which this recipe may not do: its header declares `// needs: clean`"),
            "{e}"
        );
        let e = Powers::only(&[]).check(Act::Signal, "kill()").unwrap_err();
        assert!(e.contains("`// needs: none`"), "{e}");
        assert!(Powers::only(&[Need::Kill])
            .check(Act::Signal, "kill()")
            .is_ok());
    }
}
