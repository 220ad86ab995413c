//! Hostlist expressions as Slurm and ClusterShell write them: `gpu[01-16],login1`,
//! `rack[1-2]-n[1,3-4]`; zero padding is kept from the range's first bound.
//!
//! Parsed in one pass without recursion, and sized before anything is expanded: an
//! expression of 20,000 groups (`x[1][1]…`) or a range of millions is an error at once,
//! and expanding costs time in proportion to the names it makes.

use super::HostError;
use std::collections::HashSet;

/// At most this many hosts in one host set, and names made from one expression (repeats
/// counted): a typo like `n[1-9999999]` is an error, not a million ssh processes. Slurm's
/// largest clusters have tens of thousands of nodes.
pub const MAX_HOSTS: usize = 65_536;

/// At most this many bytes in one name: a DNS name has at most 253, and an ssh destination
/// adds a user and a port.
pub const MAX_NAME: usize = 1024;

/// How much of an expression an error quotes.
const QUOTED: usize = 80;

/// Expands an expression into host names, in the order written, duplicates removed.
pub fn expand(expr: &str) -> Result<Vec<String>, HostError> {
    let mut set = HostSet::default();
    set.add_expr(expr)?;
    Ok(set.into_names())
}

/// A set of host names in the order first named, each once, of at most `MAX_HOSTS`.
#[derive(Debug, Default)]
pub(crate) struct HostSet {
    names: Vec<String>,
    seen: HashSet<String>,
}

impl HostSet {
    /// Adds the names of a hostlist expression (one that names none is an error).
    pub(crate) fn add_expr(&mut self, expr: &str) -> Result<(), HostError> {
        let items = split_top(expr).map_err(|w| bad(expr, w))?;
        let mut made = 0usize;
        for item in items {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let pattern = Pattern::parse(item).map_err(|w| bad(expr, w))?;
            made = made.saturating_add(pattern.count);
            if made > MAX_HOSTS {
                return Err(bad(expr, format!("names more than {MAX_HOSTS} hosts")));
            }
            for name in pattern.names() {
                self.add(name).map_err(|w| bad(expr, w))?;
            }
        }
        if made == 0 {
            return Err(bad(expr, "names no host".into()));
        }
        Ok(())
    }

    /// Adds one name (a no-op for one already in the set).
    pub(crate) fn add(&mut self, name: String) -> Result<(), String> {
        if self.seen.contains(&name) {
            return Ok(());
        }
        if self.names.len() >= MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} hosts in all"));
        }
        self.seen.insert(name.clone());
        self.names.push(name);
        Ok(())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub(crate) fn into_names(self) -> Vec<String> {
        self.names
    }
}

/// The error for `expr`, quoting at most its first `QUOTED` characters.
fn bad(expr: &str, why: String) -> HostError {
    let expr = match expr.char_indices().nth(QUOTED) {
        Some((i, _)) => format!("{}…", &expr[..i]),
        None => expr.to_string(),
    };
    HostError::BadHostlist { expr, why }
}

/// Splits on commas outside brackets.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut open, mut start) = (false, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' if open => return Err("nested brackets".into()),
            ']' if !open => return Err("a ] with no [ before it".into()),
            '[' | ']' => open = !open,
            ',' if !open => {
                parts.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if open {
        return Err("unclosed bracket".into());
    }
    parts.push(&expr[start..]);
    Ok(parts)
}

/// One number range of a bracket: `lo..=hi`, printed `width` digits wide (0: as is).
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    fn len(&self) -> usize {
        // Checked against MAX_HOSTS when parsed.
        (self.hi - self.lo + 1) as usize
    }

    /// The `i`th value, as text.
    fn nth(&self, i: usize) -> String {
        format!("{:0w$}", self.lo + i as u64, w = self.width)
    }
}

/// One bracket group: its ranges, and how many values they give.
#[derive(Debug)]
struct Group {
    ranges: Vec<Range>,
    count: usize,
}

impl Group {
    fn nth(&self, mut i: usize) -> String {
        for r in &self.ranges {
            if i < r.len() {
                return r.nth(i);
            }
            i -= r.len();
        }
        String::new()
    }
}

/// One item (no top-level comma): text and bracket groups in turn, `texts.len() ==
/// groups.len() + 1`.
#[derive(Debug)]
struct Pattern<'a> {
    texts: Vec<&'a str>,
    groups: Vec<Group>,
    /// How many names it makes (at most `MAX_HOSTS`).
    count: usize,
}

impl<'a> Pattern<'a> {
    /// Reads the item left to right; every group is sized, and the product of the sizes and
    /// the length of a name are checked, before any name is made.
    fn parse(item: &'a str) -> Result<Pattern<'a>, String> {
        let (mut texts, mut groups) = (Vec::new(), Vec::new());
        let mut rest = item;
        let mut count = 1usize;
        let mut name_len = 0usize;
        while let Some(open) = rest.find('[') {
            let close = rest[open..]
                .find(']')
                .map(|i| open + i)
                .ok_or("unclosed bracket")?;
            let group = parse_group(&rest[open + 1..close])?;
            count = count
                .checked_mul(group.count)
                .filter(|&c| c <= MAX_HOSTS)
                .ok_or_else(|| format!("names more than {MAX_HOSTS} hosts"))?;
            let widest = group
                .ranges
                .iter()
                .map(|r| r.nth(r.len() - 1).len())
                .max()
                .unwrap_or(0);
            name_len = name_len.saturating_add(open).saturating_add(widest);
            if name_len > MAX_NAME {
                return Err(format!("makes a name longer than {MAX_NAME} bytes"));
            }
            texts.push(&rest[..open]);
            groups.push(group);
            rest = &rest[close + 1..];
        }
        if rest.contains(']') {
            return Err("a ] with no [ before it".into());
        }
        if name_len.saturating_add(rest.len()) > MAX_NAME {
            return Err(format!("makes a name longer than {MAX_NAME} bytes"));
        }
        texts.push(rest);
        Ok(Pattern {
            texts,
            groups,
            count,
        })
    }

    /// The names, the last group varying fastest (`r[1-2]-n[1-2]`: r1-n1 r1-n2 r2-n1 r2-n2).
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.count).map(move |mut k| {
            let mut values = vec![String::new(); self.groups.len()];
            for (g, v) in self.groups.iter().zip(values.iter_mut()).rev() {
                *v = g.nth(k % g.count);
                k /= g.count;
            }
            let mut name = String::with_capacity(MAX_NAME.min(64));
            for (t, v) in self.texts.iter().zip(&values) {
                name.push_str(t);
                name.push_str(v);
            }
            name.push_str(self.texts[self.texts.len() - 1]);
            name
        })
    }
}

/// `01-03,7` → ranges 01..=03 (two wide) and 7..=7.
fn parse_group(body: &str) -> Result<Group, String> {
    let mut ranges = Vec::new();
    let mut count = 0usize;
    for r in body.split(',') {
        let r = r.trim();
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let num = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{r:?} is not a number or a range like 01-16"));
            }
            s.parse().map_err(|_| format!("{s:?} is too large"))
        };
        let (a, b) = (num(lo)?, num(hi)?);
        if b < a {
            return Err(format!("range {r:?} runs backwards"));
        }
        count = usize::try_from(b - a)
            .ok()
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_add(count))
            .filter(|&c| c <= MAX_HOSTS)
            .ok_or_else(|| format!("names more than {MAX_HOSTS} hosts"))?;
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        if width > MAX_NAME {
            return Err(format!("makes a name longer than {MAX_NAME} bytes"));
        }
        ranges.push(Range {
            lo: a,
            hi: b,
            width,
        });
    }
    Ok(Group { ranges, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_slurm_and_clustershell_forms() {
        assert_eq!(expand("login1").unwrap(), ["login1"]);
        assert_eq!(
            expand("gpu[01-03],login1").unwrap(),
            ["gpu01", "gpu02", "gpu03", "login1"]
        );
        assert_eq!(expand("n[8-10]").unwrap(), ["n8", "n9", "n10"]);
        assert_eq!(expand("n[1,3-4]").unwrap(), ["n1", "n3", "n4"]);
        assert_eq!(
            expand("r[1-2]-n[1-2]").unwrap(),
            ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
        );
        assert_eq!(expand("gpu[01-16]").unwrap().len(), 16);
        assert_eq!(expand("a,b,a").unwrap(), ["a", "b"]);
        assert_eq!(
            expand("alice@gpu[1-2]").unwrap(),
            ["alice@gpu1", "alice@gpu2"]
        );
        assert_eq!(expand("n[1-2]x[7]").unwrap(), ["n1x7", "n2x7"]);
        assert_eq!(expand("n[098-100]").unwrap(), ["n098", "n099", "n100"]);
    }

    #[test]
    fn rejects_what_it_cannot_expand() {
        for bad in [
            "gpu[01-",
            "gpu]",
            "n[3-1]",
            "n[a-b]",
            "n[[1]]",
            "",
            " , ",
            "n[1-99999999]",
            "n[1-99999999999999999999999]",
            "n[1-65537]",
            "n[1-256][1-257]",
            "a]b[1]",
        ] {
            let e = expand(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    /// 20,000 nested groups recursed once per group and overflowed the stack (an abort, 134).
    #[test]
    fn twenty_thousand_groups_are_an_error_not_a_stack_overflow() {
        let expr = format!("x{}", "[1]".repeat(20_000));
        let e = expand(&expr).unwrap_err().to_string();
        assert!(e.contains("longer than 1024 bytes"), "{e}");
        // The message quotes the start of the expression, not all 60 KB of it.
        assert!(e.len() < 300, "{}", e.len());
        let nested = format!("{}1{}", "[".repeat(20_000), "]".repeat(20_000));
        assert!(expand(&nested).unwrap_err().to_string().contains("nested"));
        // Short groups in a row are still fine.
        assert_eq!(expand(&format!("x{}", "[1]".repeat(100))).unwrap().len(), 1);
    }

    /// `gpu[1-65535]` took 17 s of CPU: every name was compared with every earlier one.
    #[test]
    fn the_largest_host_set_expands_in_linear_time() {
        let names = expand("gpu[1-65536]").unwrap();
        assert_eq!(names.len(), MAX_HOSTS);
        assert_eq!(names[65_535], "gpu65536");
        let e = expand("gpu[1-65536],login1").unwrap_err().to_string();
        assert!(e.contains("more than 65536 hosts"), "{e}");
    }

    /// The fuzz target's seeds (fuzz/corpus/hostlist, nesting cases among them), through
    /// the parser here too, where cargo-fuzz is not installed.
    #[test]
    fn the_fuzz_corpus_expands_within_the_limits_or_is_an_error() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/hostlist");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            match expand(&text) {
                Ok(names) => {
                    assert!(!names.is_empty() && names.len() <= MAX_HOSTS, "{path:?}");
                    assert!(names.iter().all(|n| n.len() <= MAX_NAME), "{path:?}");
                }
                Err(e) => assert!(e.to_string().len() < 400, "{path:?}: {e}"),
            }
            seen += 1;
        }
        assert!(seen >= 10, "{seen} seeds in {dir:?}");
    }

    #[test]
    fn a_host_set_holds_each_name_once_and_at_most_the_limit() {
        let mut set = HostSet::default();
        set.add_expr("a,b").unwrap();
        set.add_expr("b,c").unwrap();
        set.add_expr("n[1-65533]").unwrap();
        let e = set.add_expr("m1").unwrap_err().to_string();
        assert!(e.contains("more than 65536 hosts in all"), "{e}");
        let names = set.into_names();
        assert_eq!(names.len(), 3 + 65533);
        assert_eq!(names[..4], ["a", "b", "c", "n1"]);
    }
}
