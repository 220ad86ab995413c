//! Small state files kept beside the journal (the restarters seen), with the journal's care.

use super::files::{open_dir, open_existing_dir, open_file, Open};
use super::{not_found, JournalError};
use rustix::fs::FlockOperation;
use std::io::Read;
use std::path::Path;

/// Reads at most `max` bytes of a small state file `name` kept beside the journal in `dir`,
/// with the journal's care (no link followed, ours alone); `None` when there is none.
pub(crate) fn read_state(
    dir: &Path,
    name: &str,
    max: u64,
) -> Result<Option<Vec<u8>>, JournalError> {
    let Some(dirfd) = open_existing_dir(dir)? else {
        return Ok(None);
    };
    let Some(fd) = open_file(&dirfd, dir, name, Open::Read)? else {
        return Ok(None);
    };
    let bytes = at_most(&mut std::fs::File::from(fd), max).map_err(|source| JournalError::Io {
        path: dir.join(name),
        source,
    })?;
    Ok(Some(bytes))
}

/// The first `max` bytes of `file`, read from where it is.
fn at_most(file: &mut std::fs::File, max: u64) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len().min(max);
    crate::input::read_sized(file.take(max), len)
}

/// Rewrites the state file `name` in `dir` (created 0600, as the journal is) with what
/// `change` makes of its first `max` bytes, under a lock on the file, so concurrent gpuloops
/// each see the other's change.
pub(crate) fn update_state(
    dir: &Path,
    name: &str,
    max: u64,
    change: impl FnOnce(&[u8]) -> Vec<u8>,
) -> Result<(), JournalError> {
    let path = dir.join(name);
    let io = |source: std::io::Error| JournalError::Io {
        path: path.clone(),
        source,
    };
    let dirfd = open_dir(dir)?;
    let fd = open_file(&dirfd, dir, name, Open::Update)?.ok_or_else(|| io(not_found()))?;
    rustix::fs::flock(&fd, FlockOperation::LockExclusive).map_err(|e| io(e.into()))?;
    let mut file = std::fs::File::from(fd);
    let old = at_most(&mut file, max).map_err(io)?;
    let new = change(&old);
    // Written over in place, then cut to its new length where that is shorter: never cut to
    // nothing first, which ext4 (auto_da_alloc) takes for a file being replaced and then
    // writes out to disk on close, at a cost of a few hundred µs.
    std::os::unix::fs::FileExt::write_all_at(&file, &new, 0).map_err(io)?;
    if (new.len() as u64) < file.metadata().map_err(io)?.len() {
        file.set_len(new.len() as u64).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file beside the journal is kept as the journal is: 0600, rewritten whole, never
    /// read or written through a link.
    #[test]
    fn a_state_file_is_the_users_alone_and_follows_no_link() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("state").join("gpuloop");
        assert_eq!(read_state(&dir, "s.json", 100).unwrap(), None);
        assert!(!dir.exists(), "reading creates nothing");
        update_state(&dir, "s.json", 100, |old| [old, b"long"].concat()).unwrap();
        update_state(&dir, "s.json", 100, |old| {
            assert_eq!(old, b"long");
            b"ab".to_vec()
        })
        .unwrap();
        assert_eq!(read_state(&dir, "s.json", 100).unwrap().unwrap(), b"ab");
        assert_eq!(read_state(&dir, "s.json", 1).unwrap().unwrap(), b"a");
        let mode = std::fs::metadata(dir.join("s.json")).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let victim = top.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("l.json")).unwrap();
        let e = update_state(&dir, "l.json", 100, |_| b"x".to_vec()).unwrap_err();
        assert!(e.to_string().contains("a symbolic link; refused"), "{e}");
        assert!(read_state(&dir, "l.json", 100).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }
}
