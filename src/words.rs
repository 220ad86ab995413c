//! Words for people: a count with its noun in the number it asks for ("1 holder", "3 holders").

/// `n` and its noun: `count(1, "holder", "holders")` is "1 holder", `count(0, …)` "0 holders".
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", pick(n, one, many))
}

/// The form of a word that `n` things ask for: a noun ("pid", "pids") or a verb ("holds"
/// for one holder, "hold" for several).
pub(crate) fn pick<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(count(1, "holder", "holders"), "1 holder");
        assert_eq!(count(0, "holder", "holders"), "0 holders");
        assert_eq!(count(2, "process", "processes"), "2 processes");
        assert_eq!(pick(1, "holds", "hold"), "holds");
        assert_eq!(pick(3, "holds", "hold"), "hold");
    }
}
