//! The user's configuration file (`~/.config/gpuloop/config.toml`): which processes are protected.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// GPU daemons and infrastructure that kill() leaves alone unless forced.
pub const DEFAULT_PROTECTED: &[&str] = &[
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
}

#[derive(Debug, Clone)]
pub struct UserConfig {
    pub protected: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("config file {path}: {why}")]
pub struct ConfigError {
    pub path: PathBuf,
    pub why: String,
}

/// `~/.config/gpuloop` (or `$XDG_CONFIG_HOME/gpuloop`).
pub fn config_dir() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("gpuloop"))
}

impl Default for UserConfig {
    fn default() -> Self {
        UserConfig {
            protected: DEFAULT_PROTECTED.iter().map(|s| s.to_string()).collect(),
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

    pub fn from_file(path: &Path) -> Result<UserConfig, ConfigError> {
        let err = |why: String| ConfigError {
            path: path.to_path_buf(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let f: File = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        let mut cfg = UserConfig::default();
        if let Some(list) = f.protected {
            cfg.protected = list;
        }
        cfg.protected.extend(f.protected_add.unwrap_or_default());
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        std::fs::write(&p, "protectd = []\n").unwrap();
        assert!(UserConfig::from_file(&p)
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
    }
}
