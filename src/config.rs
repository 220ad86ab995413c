//! The user's configuration file (`~/.config/gpuloop/config.toml`): which processes are
//! protected, what the MCP server may do, and where the container runtimes keep their state.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// GPU daemons and infrastructure that kill() leaves alone unless forced: names a process
/// claims, which `process::daemon` proves or not.
pub(crate) const DEFAULT_PROTECTED: &[&str] = &[
    "nvidia-persistenced",
    "nv-hostengine",
    "nvidia-fabricmanager",
    "nv-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-powerd",
    "dcgm-exporter",
    "dcgmproftester",
    "nvidia-device-plugin",
    "k8s-device-plugin",
    "Xorg",
    "Xwayland",
    "gnome-shell",
];

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    /// Replaces the default list.
    protected: Option<Vec<String>>,
    /// Added to the (default or replaced) list.
    protected_add: Option<Vec<String>>,
    /// `[limits]`: resource limits for scripts.
    limits: Option<Limits>,
    /// `[mcp]`: the MCP server's policy.
    mcp: Option<McpTable>,
    /// `[containers]`: where the runtimes and the kubelet keep their state on this node.
    containers: Option<crate::process::container::Roots>,
    /// Where Xid events are read: the kernel log (`/dev/kmsg`), or a file of its records.
    kernel_log: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct McpTable {
    /// What the MCP server may do beyond reading: "kill", "clean", "run", "recipes".
    allow: Option<Vec<String>>,
}

/// Resource limits for scripts: passing one is a script error, never an abort for want of
/// memory or stack. Set in `[limits]` of config.toml or with `--limit NAME=N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Elements of an array or BLOB, nested ones counted.
    pub array: usize,
    /// Bytes of a string.
    pub string: usize,
    /// Entries of an object map, nested ones counted.
    pub map: usize,
    /// Script-function calls nested in each other.
    pub calls: usize,
    /// Expressions nested in the source.
    pub expr_depth: usize,
    /// Arrays and maps nested in each other.
    pub depth: usize,
    /// Bytes the gpuloop process may have allocated while a script runs: checked between the
    /// script's steps, so a runaway value (a closure curried with itself, say) is an error
    /// before the machine runs out of memory.
    pub memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            array: 10_000_000,
            string: 256 << 20,
            map: 1_000_000,
            calls: 256,
            expr_depth: 256,
            depth: Limits::DEFAULT_DEPTH,
            memory: 4 << 30,
        }
    }
}

impl Limits {
    /// Arrays and maps nested in each other. Every step that nests a value one deeper copies
    /// it, so building a value N deep costs N²: at 1,000 that is milliseconds, at 100,000 an
    /// hour. JSON parsers stop at 128.
    pub(crate) const DEFAULT_DEPTH: usize = 1_000;

    pub(crate) const NAMES: &'static [&'static str] = &[
        "array",
        "string",
        "map",
        "calls",
        "expr_depth",
        "depth",
        "memory",
    ];

    /// Applies `NAME=N` (from `--limit`); `N` may end in K, M or G (×1024).
    pub fn set(&mut self, item: &str) -> Result<(), LimitError> {
        let bad = |fault| LimitError {
            item: item.to_string(),
            fault,
        };
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| bad(LimitFault::NoValue))?;
        let value = value.trim();
        let (digits, unit) = match value.char_indices().last() {
            Some((i, c)) if i > 0 && c.is_ascii_alphabetic() => (&value[..i], Some(c)),
            _ => (value, None),
        };
        // "abc" is no number with a unit 'c': say what is wrong with the whole value.
        let digits = digits.trim();
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(LimitFault::NotANumber(value.to_string())));
        }
        let scale: usize = match unit.map(|c| c.to_ascii_uppercase()) {
            None => 1,
            Some('K') => 1 << 10,
            Some('M') => 1 << 20,
            Some('G') => 1 << 30,
            Some(c) => {
                return Err(bad(LimitFault::UnknownUnit {
                    value: value.to_string(),
                    unit: c,
                }))
            }
        };
        let n = digits
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(LimitFault::NotPositive))?;
        let slot = match name.trim() {
            "array" => &mut self.array,
            "string" => &mut self.string,
            "map" => &mut self.map,
            "calls" => &mut self.calls,
            "expr_depth" => &mut self.expr_depth,
            "depth" => &mut self.depth,
            "memory" => &mut self.memory,
            other => return Err(bad(LimitFault::UnknownName(other.to_string()))),
        };
        *slot = n;
        Ok(())
    }
}

/// A `--limit NAME=N` that sets nothing: the item as given, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.said())]
pub struct LimitError {
    pub item: String,
    pub fault: LimitFault,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitFault {
    /// No `=`.
    NoValue,
    NotANumber(String),
    UnknownUnit {
        value: String,
        unit: char,
    },
    /// Zero, or past what a `usize` holds.
    NotPositive,
    UnknownName(String),
}

impl LimitError {
    fn said(&self) -> String {
        let units = "a whole number, optionally with a unit: K, M or G (x1024), e.g. 64M";
        let item = &self.item;
        match &self.fault {
            LimitFault::NoValue => format!("--limit {item:?}: expected NAME=N, e.g. array=1000000"),
            LimitFault::NotANumber(value) => format!("--limit {item:?}: {value:?} is not {units}"),
            LimitFault::UnknownUnit { value, unit } => format!(
                "--limit {item:?}: {value:?} has an unknown unit {unit:?}: N must be {units}"
            ),
            LimitFault::NotPositive => format!("--limit {item:?}: N must be a positive integer"),
            LimitFault::UnknownName(name) => format!(
                "--limit: unknown limit {name:?} (known: {})",
                Limits::NAMES.join(", ")
            ),
        }
    }
}

#[derive(Debug, Clone)]
pub struct UserConfig {
    pub protected: Vec<String>,
    pub limits: Limits,
    /// `[mcp] allow = [...]`, added to `gpuloop mcp --allow`.
    pub mcp_allow: Vec<String>,
    /// `[containers]`: the runtimes' and the kubelet's state directories.
    pub containers: crate::process::container::Roots,
    /// `kernel_log = "/dev/kmsg"`: where the driver's Xid events are read (the simulator
    /// reads its own).
    pub kernel_log: PathBuf,
}

#[derive(Debug, thiserror::Error)]
#[error("config file {path}: {why}")]
pub struct ConfigError {
    pub path: PathBuf,
    pub why: String,
}

/// `~/.config/gpuloop` (or `$XDG_CONFIG_HOME/gpuloop`).
pub(crate) fn config_dir() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("gpuloop"))
}

impl Default for UserConfig {
    fn default() -> Self {
        UserConfig {
            protected: DEFAULT_PROTECTED.iter().map(|s| s.to_string()).collect(),
            limits: Limits::default(),
            mcp_allow: Vec::new(),
            containers: Default::default(),
            kernel_log: PathBuf::from(crate::gpu::kmsg::DEV_KMSG),
        }
    }
}

impl UserConfig {
    /// Reads the config file if there is one; defaults otherwise.
    pub fn load() -> Result<UserConfig, ConfigError> {
        match config_dir().map(|d| d.join("config.toml")) {
            Some(p) if p.exists() => UserConfig::from_file(&p),
            _ => Ok(UserConfig::default()),
        }
    }

    pub(crate) fn from_file(path: &Path) -> Result<UserConfig, ConfigError> {
        let err = |why: String| ConfigError {
            path: path.to_path_buf(),
            why,
        };
        let text =
            crate::input::text(path, crate::input::CONFIG).map_err(|e| err(e.to_string()))?;
        UserConfig::parse(path, &text)
    }

    /// Parses the text of a config file; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<UserConfig, ConfigError> {
        let f: File = toml::from_str(text).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
        let mut cfg = UserConfig::default();
        if let Some(list) = f.protected {
            cfg.protected = list;
        }
        cfg.protected.extend(f.protected_add.unwrap_or_default());
        cfg.limits = f.limits.unwrap_or_default();
        cfg.mcp_allow = f.mcp.and_then(|m| m.allow).unwrap_or_default();
        if let Some(p) = f.kernel_log {
            cfg.kernel_log = p;
        }
        cfg.containers = f.containers.unwrap_or_default();
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each way a `--limit` goes wrong is its own fault, with the words it always had.
    #[test]
    fn a_bad_limit_says_which_fault_in_its_usual_words() {
        let fault = |item: &str| Limits::default().set(item).unwrap_err();
        assert_eq!(fault("array").fault, LimitFault::NoValue);
        assert_eq!(
            fault("string=abc").fault,
            LimitFault::NotANumber("abc".into())
        );
        assert_eq!(
            fault("string=abc").to_string(),
            r#"--limit "string=abc": "abc" is not a whole number, optionally with a unit: K, M or G (x1024), e.g. 64M"#
        );
        assert_eq!(
            fault("string=5T").fault,
            LimitFault::UnknownUnit {
                value: "5T".into(),
                unit: 'T'
            }
        );
        assert_eq!(fault("calls=0").fault, LimitFault::NotPositive);
        assert_eq!(
            fault("nope=1").fault,
            LimitFault::UnknownName("nope".into())
        );
        assert!(fault("nope=1")
            .to_string()
            .starts_with(r#"--limit: unknown limit "nope" (known: array,"#));
        let mut l = Limits::default();
        l.set("memory=64M").unwrap();
        assert_eq!(l.memory, 64 << 20);
    }

    #[test]
    fn reads_protected_lists() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.toml");
        std::fs::write(&p, "protected_add = [\"my-exporter\"]\n").unwrap();
        let c = UserConfig::from_file(&p).unwrap();
        assert!(c.protected.contains(&"nvidia-persistenced".to_string()));
        assert!(c.protected.contains(&"my-exporter".to_string()));
        std::fs::write(&p, "protected = [\"only-this\"]\n").unwrap();
        assert_eq!(
            UserConfig::from_file(&p).unwrap().protected,
            vec!["only-this"]
        );
        std::fs::write(&p, "[mcp]\nallow = [\"clean\"]\n").unwrap();
        assert_eq!(UserConfig::from_file(&p).unwrap().mcp_allow, vec!["clean"]);
        assert_eq!(
            UserConfig::from_file(&p).unwrap().kernel_log,
            Path::new("/dev/kmsg")
        );
        std::fs::write(&p, "kernel_log = \"/tmp/kmsg\"\n").unwrap();
        assert_eq!(
            UserConfig::from_file(&p).unwrap().kernel_log,
            Path::new("/tmp/kmsg")
        );
        std::fs::write(&p, "[containers]\nkubelet = \"/tmp/k\"\n").unwrap();
        let c = UserConfig::from_file(&p).unwrap().containers;
        assert_eq!(c.kubelet, Path::new("/tmp/k"));
        // The roots not given keep their defaults.
        assert_eq!(c.docker, crate::process::container::Roots::default().docker);
        std::fs::write(&p, "[containers]\ncontainerd = \"/run/x\"\n").unwrap();
        assert!(UserConfig::from_file(&p).is_err());
        std::fs::write(&p, "protectd = []\n").unwrap();
        assert!(UserConfig::from_file(&p)
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
    }
}
