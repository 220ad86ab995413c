//! What the REPL reads: whether the input so far is complete, and the imports it makes.

use rhai::{ParseError, ParseErrorType, Position};

/// True when the parse error only says the input stopped too early (an open brace or bracket,
/// a trailing operator, an open back-tick string), so the next line should continue it.
pub(super) fn incomplete(err: &ParseError, input: &str) -> bool {
    match err.err_type() {
        ParseErrorType::UnexpectedEOF => true,
        ParseErrorType::BadInput(rhai::LexError::UnterminatedString) => {
            // Only back-tick strings may span lines; an open "…" is a mistake on this line.
            char_at(input, err.position()) == Some('`')
        }
        _ => at_end(input, err.position()),
    }
}

/// Whether the error sits past the last character of the input (rhai reports a missing
/// closing token where the input ends).
fn at_end(input: &str, pos: Position) -> bool {
    let (Some(line), Some(col)) = (pos.line(), pos.position()) else {
        return false;
    };
    let lines: Vec<&str> = input.split('\n').collect();
    let last = lines.len();
    // Trailing blank lines do not count: the input ended where its text did.
    let Some(text_end) = lines.iter().rposition(|l| !l.trim().is_empty()) else {
        return true;
    };
    if line > text_end + 1 {
        return line <= last;
    }
    line == text_end + 1 && col > lines[text_end].trim_end().chars().count()
}

fn char_at(input: &str, pos: Position) -> Option<char> {
    let line = input.split('\n').nth(pos.line()?.checked_sub(1)?)?;
    line.chars().nth(pos.position()?.checked_sub(1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(src: &str) -> Option<bool> {
        match rhai::Engine::new().compile(src) {
            Ok(_) => None,
            Err(e) => Some(incomplete(&e, src)),
        }
    }

    #[test]
    fn open_input_continues() {
        for src in [
            "fn f() {",
            "fn f(x) {\n  x +",
            "1 +",
            "let x = ",
            "let a = [1,",
            "#{a: 1,",
            "foo(1,",
            "if true {\n",
            "let s = `one\ntwo",
            "fn f() {\n\n",
        ] {
            assert_eq!(check(src), Some(true), "{src:?} should continue");
        }
    }

    #[test]
    fn mistakes_are_errors_not_continuations() {
        for src in [
            "let x = 1 +* 2;",
            "let = 3;",
            "1 2",
            "}",
            "\"abc",
            "let x = (1 2",
        ] {
            assert_eq!(check(src), Some(false), "{src:?} is an error");
        }
    }

    #[test]
    fn complete_input_compiles() {
        assert_eq!(check("fn f() {\n 1\n}"), None);
    }
}
