//! How a host is reached: in-process (`local`), or an agent started through OpenSSH.
//!
//! A transport only says which command starts `gpuloop agent` for a destination and how to
//! read that command's failure; the client does the rest (stdio framing, hello, deadlines).
//! To add one (`srun --overlap --jobid J -w NODE gpuloop agent`), add a variant, its argv
//! in `launch`, and its failure reading in `classify`.

use super::HostError;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub enum Transport {
    /// The system's OpenSSH client.
    Ssh(SshOpts),
}

#[derive(Debug, Clone, Default)]
pub struct SshOpts {
    /// `-F FILE`.
    pub config: Option<PathBuf>,
    /// The gpuloop to run there (`gpuloop`, found on the remote PATH, by default).
    pub remote_bin: String,
    /// ssh's own ConnectTimeout, in seconds.
    pub connect_timeout_s: u64,
}

/// A command that starts an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
}

impl Transport {
    pub fn ssh(config: Option<PathBuf>, remote_bin: Option<String>) -> Transport {
        Transport::Ssh(SshOpts {
            config,
            remote_bin: remote_bin.unwrap_or_else(|| "gpuloop".into()),
            connect_timeout_s: 15,
        })
    }

    /// The command that starts `gpuloop agent` on `dest`.
    pub fn launch(&self, dest: &str) -> Launch {
        match self {
            Transport::Ssh(o) => {
                // BatchMode: never prompt (there is no one to answer); host key checking is
                // left to the user's config.
                let mut args = vec![
                    "-o".to_string(),
                    "BatchMode=yes".into(),
                    "-o".into(),
                    format!("ConnectTimeout={}", o.connect_timeout_s),
                    "-T".into(),
                ];
                if let Some(f) = &o.config {
                    args.push("-F".into());
                    args.push(f.display().to_string());
                }
                args.push("--".into());
                args.push(dest.to_string());
                // One word for the remote shell: a path with spaces stays one path.
                args.push(format!("{} agent", shell_quote(&o.remote_bin)));
                Launch {
                    program: "ssh".into(),
                    args,
                }
            }
        }
    }

    /// Reads why the command ended before the agent said hello: its exit code and stderr.
    pub fn classify(&self, dest: &str, code: Option<i32>, stderr: &str) -> HostError {
        let said = stderr.trim();
        let said = if said.is_empty() {
            match code {
                Some(c) => format!("ssh exited with code {c} and said nothing"),
                None => "ssh was killed by a signal".into(),
            }
        } else {
            said.lines()
                .rev()
                .take(4)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" / ")
        };
        match self {
            Transport::Ssh(_) => {
                // 127: the remote shell found no such command; 126: found, not executable.
                let missing = matches!(code, Some(126 | 127))
                    || said.contains("command not found")
                    || said.contains("No such file or directory") && code != Some(255);
                if missing {
                    HostError::NoAgent {
                        host: dest.to_string(),
                        why: format!("ssh said: {said}"),
                    }
                } else {
                    HostError::Connect {
                        host: dest.to_string(),
                        why: format!("ssh said: {said}"),
                    }
                }
            }
        }
    }
}

/// Quotes a word for a POSIX shell unless it needs none.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_never_prompts_and_keeps_host_key_checking() {
        let t = Transport::ssh(Some("/tmp/cfg".into()), Some("/opt/my gpuloop".into()));
        let l = t.launch("alice@gpu01");
        assert_eq!(l.program, "ssh");
        let line = l.args.join(" ");
        assert!(line.starts_with("-o BatchMode=yes"), "{line}");
        assert!(
            line.contains("-F /tmp/cfg -- alice@gpu01 '/opt/my gpuloop' agent"),
            "{line}"
        );
        assert!(!line.contains("StrictHostKeyChecking"), "{line}");
    }

    #[test]
    fn failures_before_hello_are_named_and_quote_ssh() {
        let t = Transport::ssh(None, None);
        let e = t.classify(
            "gpu01",
            Some(127),
            "bash: line 1: gpuloop: command not found\n",
        );
        assert!(matches!(e, HostError::NoAgent { .. }), "{e}");
        assert!(e.to_string().contains("command not found"), "{e}");
        let e = t.classify(
            "gpu02",
            Some(255),
            "ssh: connect to host gpu02 port 22: Connection refused\n",
        );
        assert_eq!(
            e.to_string(),
            "host gpu02: cannot connect: ssh said: ssh: connect to host gpu02 port 22: Connection refused"
        );
    }
}
