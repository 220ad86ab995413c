//! Host names back into a hostlist (`gpu[01-04,06]`, as `dshbak -c` and `clush -b` write
//! them): what a summary over many hosts prints instead of one line per host.

/// One host name taken apart at its last run of digits: `gpu07.rack2` is ("gpu", "07",
/// ".rack2"); a name without digits has none.
fn split(name: &str) -> Option<(&str, &str, &str)> {
    let b = name.as_bytes();
    let end = b.iter().rposition(u8::is_ascii_digit)? + 1;
    let start = b[..end]
        .iter()
        .rposition(|c| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    Some((&name[..start], &name[start..end], &name[end..]))
}

/// The names as one hostlist expression that `hostlist::expand` turns back into the same
/// names: names that differ only in their last number share a bracket, zero padding kept.
/// Groups come in the order their first name was given.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    struct Group<'a> {
        prefix: &'a str,
        suffix: &'a str,
        /// Digits of a zero-padded number (`07`: 2); 0 for numbers written without padding.
        width: usize,
        values: Vec<u64>,
        verbatim: Option<&'a str>,
    }
    use std::collections::{HashMap, HashSet};
    let mut groups: Vec<Group> = Vec::new();
    // Each (prefix, suffix)'s groups, in the order made (one per padding width at most), and
    // each group's values: every name finds its group and its value's place without a
    // search over all of them (which made 65,536 names quadratic).
    let mut by_affix: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    let mut seen: HashSet<(usize, u64)> = HashSet::new();
    let mut verbatim: HashSet<&str> = HashSet::new();
    for name in names.iter().map(AsRef::as_ref) {
        let parsed = split(name).and_then(|(p, d, s)| {
            let v: u64 = d.parse().ok()?;
            let padded = d.len() > 1 && d.starts_with('0');
            Some((p, d, s, v, padded))
        });
        let Some((prefix, digits, suffix, value, padded)) = parsed else {
            if verbatim.insert(name) {
                groups.push(Group {
                    prefix: "",
                    suffix: "",
                    width: 0,
                    values: Vec::new(),
                    verbatim: Some(name),
                });
            }
            continue;
        };
        // An unpadded number joins a padded group when padding would write it the same
        // (`10` in `gpu[01-09]`); a padded one only its own width.
        let fits = |g: &Group| {
            if padded {
                g.width == digits.len()
            } else {
                digits.len() >= g.width
            }
        };
        let mine = by_affix.entry((prefix, suffix)).or_default();
        match mine.iter().copied().find(|&i| fits(&groups[i])) {
            Some(i) => {
                if seen.insert((i, value)) {
                    groups[i].values.push(value);
                }
            }
            None => {
                mine.push(groups.len());
                seen.insert((groups.len(), value));
                groups.push(Group {
                    prefix,
                    suffix,
                    width: if padded { digits.len() } else { 0 },
                    values: vec![value],
                    verbatim: None,
                });
            }
        }
    }
    let mut out = Vec::new();
    for mut g in groups {
        if let Some(v) = g.verbatim {
            out.push(v.to_string());
            continue;
        }
        g.values.sort_unstable();
        let w = g.width;
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < g.values.len() {
            let mut j = i;
            while j + 1 < g.values.len() && g.values[j + 1] == g.values[j] + 1 {
                j += 1;
            }
            ranges.push(match j - i {
                0 => format!("{:0w$}", g.values[i]),
                _ => format!("{:0w$}-{:0w$}", g.values[i], g.values[j]),
            });
            i = j + 1;
        }
        out.push(match (g.values.len(), ranges.as_slice()) {
            (1, [one]) => format!("{}{one}{}", g.prefix, g.suffix),
            _ => format!("{}[{}]{}", g.prefix, ranges.join(","), g.suffix),
        });
    }
    out.join(",")
}

/// The host set in a message: its first names, and how many more (a set of 65,536 hosts
/// listed whole was a message of a megabyte).
pub(crate) fn set_of<S: AsRef<str>>(names: &[S]) -> String {
    const SHOWN: usize = 8;
    let first: Vec<&str> = names.iter().take(SHOWN).map(AsRef::as_ref).collect();
    match names.len().saturating_sub(SHOWN) {
        0 => first.join(", "),
        more => format!("{}, … and {more} more", first.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::hostlist::expand;

    #[test]
    fn names_fold_into_the_hostlists_slurm_writes() {
        let names: Vec<String> = (1..=64)
            .filter(|n| ![5, 33, 40].contains(n))
            .map(|n| format!("gpu{n:02}"))
            .collect();
        assert_eq!(compress(&names), "gpu[01-04,06-32,34-39,41-64]");
        assert_eq!(compress(&["gpu05", "gpu33", "gpu40"]), "gpu[05,33,40]");
        assert_eq!(compress(&["login1"]), "login1");
        assert_eq!(compress(&["n9", "n10", "n8"]), "n[8-10]");
        assert_eq!(compress(&["gpu09", "gpu10", "gpu100"]), "gpu[09-10,100]");
        assert_eq!(compress(&["a", "b", "a"]), "a,b");
        assert_eq!(
            compress(&["r1-n1", "r1-n2", "r2-n1", "login"]),
            "r1-n[1-2],r2-n1,login"
        );
        assert_eq!(
            compress(&["gpu1.x", "gpu2.x", "gpu3.y"]),
            "gpu[1-2].x,gpu3.y"
        );
        assert_eq!(compress::<&str>(&[]), "");
    }

    #[test]
    fn a_folded_hostlist_expands_to_the_same_hosts() {
        let cases: &[&[&str]] = &[
            &["gpu01", "gpu02", "gpu10", "gpu7", "login1", "alice@gpu03"],
            &["n001", "n01", "n1", "n0", "n00"],
            &["x", "x1", "1", "01", "a9b", "a10b"],
            &["h:2222", "h:2223", "localhost"],
        ];
        for names in cases {
            let folded = compress(names);
            let mut back = expand(&folded).unwrap();
            let mut want: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            back.sort();
            want.sort();
            assert_eq!(back, want, "{folded}");
        }
    }
}
