//! A run's tags: what may be a tag, checked once for every surface that starts a run.

/// The most tags one run carries.
pub const MAX_TAGS: usize = 16;
/// The longest tag, in bytes.
pub const MAX_TAG_LEN: usize = 64;

/// The tags a run is started with, or what is wrong with them in words: at most
/// [`MAX_TAGS`], each 1 to [`MAX_TAG_LEN`] characters of letters, digits and `_ - . : / =`,
/// none twice. Tags are what a policy reads, so they are plain words, never free text.
pub fn check_tags(tags: &[String]) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!(
            "a run carries at most {MAX_TAGS} tags; {} were given",
            tags.len()
        ));
    }
    for (i, tag) in tags.iter().enumerate() {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.:/=".contains(c);
        if tag.is_empty() || tag.len() > MAX_TAG_LEN || !tag.chars().all(allowed) {
            return Err(format!(
                "tag {tag:?} is not a tag: use 1 to {MAX_TAG_LEN} letters, digits or _ - . : / ="
            ));
        }
        if tags[..i].contains(tag) {
            return Err(format!("tag {tag:?} is given twice"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn plain_words_are_tags() {
        assert_eq!(
            check_tags(&tags(&["team:payments", "env=prod", "a/b_c-1.2"])),
            Ok(())
        );
        assert_eq!(check_tags(&[]), Ok(()));
    }

    #[test]
    fn free_text_long_tags_repeats_and_too_many_are_refused_in_words() {
        assert!(
            check_tags(&tags(&["two words"]))
                .unwrap_err()
                .contains("is not a tag")
        );
        assert!(
            check_tags(&tags(&[""]))
                .unwrap_err()
                .contains("is not a tag")
        );
        assert!(
            check_tags(&tags(&["é"]))
                .unwrap_err()
                .contains("is not a tag")
        );
        let long = "x".repeat(MAX_TAG_LEN + 1);
        assert!(check_tags(&[long]).unwrap_err().contains("is not a tag"));
        assert_eq!(
            check_tags(&tags(&["a", "a"])).unwrap_err(),
            "tag \"a\" is given twice"
        );
        let many: Vec<String> = (0..=MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert!(check_tags(&many).unwrap_err().contains("at most 16 tags"));
    }
}
