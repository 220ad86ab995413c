//! Reading the journal back: both files, oldest first, a bounded line at a time.

use super::files::{open_existing_dir, open_file, Open};
use super::{Filter, JournalError, Record, FILE, ROTATED};
use crate::input::{next_line, TooLarge};
use std::collections::VecDeque;
use std::io::BufReader;
use std::path::Path;

/// The longest line `gpuloop journal` reads as a record; a longer one is skipped whole, so
/// a damaged or hostile file never costs more memory than this per line.
pub(crate) const MAX_LINE: usize = 64 << 10;

/// What reading the journal found, besides the records.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Found {
    /// Lines that are not records (damaged, of another version, or longer than MAX_LINE).
    pub bad: usize,
    /// Records that matched the filter, shown or not.
    pub matched: usize,
}

/// Streams the journal in `dir` (the rotated file, then the current one), oldest first,
/// giving each record that matches `filter` to `each`; reads one line at a time, each at most
/// [`MAX_LINE`], so a huge or damaged journal costs time, never memory.
pub(crate) fn read(
    dir: &Path,
    filter: &Filter,
    each: &mut dyn FnMut(Record),
) -> Result<Found, JournalError> {
    let mut found = Found::default();
    let Some(dirfd) = open_existing_dir(dir)? else {
        return Ok(found);
    };
    for name in [ROTATED, FILE] {
        let Some(fd) = open_file(&dirfd, dir, name, Open::Read)? else {
            continue;
        };
        let path = dir.join(name);
        let mut lines = BufReader::with_capacity(MAX_LINE, std::fs::File::from(fd));
        loop {
            let line = next_line(&mut lines, MAX_LINE).map_err(|source| JournalError::Io {
                path: path.clone(),
                source,
            })?;
            let buf = match line {
                None => break,
                Some(Ok(line)) => line,
                Some(Err(TooLarge)) => {
                    found.bad += 1;
                    continue;
                }
            };
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record = match serde_json::from_slice::<Record>(&buf) {
                Ok(r) => r,
                Err(_) => {
                    found.bad += 1;
                    match glued(&buf) {
                        Some(r) => r,
                        None => continue,
                    }
                }
            };
            if filter.matches(&record) {
                found.matched += 1;
                each(record)
            }
        }
    }
    Ok(found)
}

/// How every record's line begins: `time` is its first field.
const START: &[u8] = b"{\"time\":";

/// The whole record at the end of a line that is not one: a line cut short (a full disk, a
/// crash) with the next record glued to it. The record is the one that parses from one of
/// its starts to the end of the line; a start inside a JSON string would be escaped
/// (`{\"time\":`), so only the record's own braces can be found.
fn glued(line: &[u8]) -> Option<Record> {
    memchr::memmem::find_iter(line, START)
        .skip_while(|&at| at == 0)
        .find_map(|at| serde_json::from_slice::<Record>(&line[at..]).ok())
}

/// The last `n` records matching `filter` (all of them for 0, streamed to `each` as read).
pub(crate) fn last(
    dir: &Path,
    filter: &Filter,
    n: usize,
    each: &mut dyn FnMut(Record),
) -> Result<Found, JournalError> {
    if n == 0 {
        return read(dir, filter, each);
    }
    let mut kept = VecDeque::with_capacity(n.min(1024));
    let found = read(dir, filter, &mut |r| {
        if kept.len() == n {
            kept.pop_front();
        }
        kept.push_back(r);
    })?;
    kept.into_iter().for_each(each);
    Ok(found)
}
