//! Text from a server or a library, made fit for one line of an error message.

/// How many characters an error keeps of someone else's text.
const LIMIT: usize = 200;

/// `text` on one line: control characters and runs of whitespace become one space, and
/// text longer than 200 characters is cut, ending with `…`.
pub fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let joined = spaced.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() <= LIMIT {
        joined
    } else {
        joined.chars().take(LIMIT - 1).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn whitespace_and_control_characters_become_one_space() {
        assert_eq!(one_line("  a\n\tb\u{7}c  "), "a b c");
    }

    #[test]
    fn long_text_is_cut_to_200_characters_with_an_ellipsis() {
        let cut = one_line(&"é".repeat(500));
        assert_eq!(cut.chars().count(), 200);
        assert!(cut.ends_with('…'));
        assert_eq!(one_line(&"x".repeat(200)), "x".repeat(200));
    }
}
