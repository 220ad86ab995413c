//! Hostlist expressions as Slurm and ClusterShell write them: `gpu[01-16],login1`,
//! `rack[1-2]-n[1,3-4]`; zero padding is kept from the range's first bound.

use super::HostError;

/// At most this many names from one expression (a typo like `n[1-9999999]` is an error,
/// not a million ssh processes).
pub const MAX_HOSTS: usize = 65_536;

/// Expands an expression into host names, in the order written, duplicates removed.
pub fn expand(expr: &str) -> Result<Vec<String>, HostError> {
    let bad = |why: &str| HostError::BadHostlist {
        expr: expr.to_string(),
        why: why.to_string(),
    };
    let mut out: Vec<String> = Vec::new();
    for item in split_top(expr).map_err(|w| bad(&w))? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        for name in expand_item(item).map_err(|w| bad(&w))? {
            if !out.contains(&name) {
                if out.len() >= MAX_HOSTS {
                    return Err(bad(&format!("more than {MAX_HOSTS} hosts")));
                }
                out.push(name);
            }
        }
    }
    if out.is_empty() {
        return Err(bad("names no host"));
    }
    Ok(out)
}

/// Splits on commas outside brackets.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced or nested brackets".into());
        }
    }
    if depth != 0 {
        return Err("unclosed bracket".into());
    }
    parts.push(&expr[start..]);
    Ok(parts)
}

/// One item: a prefix, then any number of `[ranges]` with text between them.
fn expand_item(item: &str) -> Result<Vec<String>, String> {
    let Some(open) = item.find('[') else {
        if item.contains(']') {
            return Err("unbalanced or nested brackets".into());
        }
        return Ok(vec![item.to_string()]);
    };
    let close = item[open..]
        .find(']')
        .map(|i| open + i)
        .ok_or("unclosed bracket")?;
    let prefix = &item[..open];
    let values = expand_ranges(&item[open + 1..close])?;
    let rests = expand_item(&item[close + 1..])?;
    let mut out = Vec::with_capacity(values.len() * rests.len());
    for v in &values {
        for r in &rests {
            if out.len() >= MAX_HOSTS {
                return Err(format!("more than {MAX_HOSTS} hosts"));
            }
            out.push(format!("{prefix}{v}{r}"));
        }
    }
    Ok(out)
}

/// `01-03,7` → `01 02 03 7`.
fn expand_ranges(body: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
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
        if b - a >= MAX_HOSTS as u64 {
            return Err(format!("more than {MAX_HOSTS} hosts"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
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
        ] {
            let e = expand(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
