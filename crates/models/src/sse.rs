//! Incremental `text/event-stream` framing (L3) over a body that grows as chunks arrive.
//!
//! The vault hands `complete_when` the whole body read so far, so the framer keeps only
//! offsets: where the next unread line starts and how far it has searched for its end.
//! Lines are cut as bytes and decoded only once complete, so a multibyte character split
//! across two chunks is read whole. It handles `\n`, `\r\n` and a lone `\r`, multi-line
//! `data`, comments, and events split anywhere.

/// One dispatched event: its `event` name (if any) and its joined `data` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) name: Option<String>,
    pub(crate) data: String,
}

/// The framer's position in the body and the event being built.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    /// Where the next unread line starts.
    line_start: usize,
    /// How far past `line_start` the search for a line end has already looked.
    searched: usize,
    name: Option<String>,
    data: String,
    has_data: bool,
}

impl Framer {
    /// Reads the complete lines of `body` not read before and calls `dispatch` for each
    /// event they complete. `body` must extend the body of the previous call.
    pub(crate) fn feed(&mut self, body: &[u8], mut dispatch: impl FnMut(Event) -> bool) -> bool {
        loop {
            let from = self.searched.max(self.line_start);
            let Some(at) = memchr::memchr2(b'\n', b'\r', &body[from.min(body.len())..]) else {
                self.searched = body.len();
                return false;
            };
            let end = from + at;
            let next = if body[end] == b'\r' {
                match body.get(end + 1) {
                    Some(b'\n') => end + 2,
                    Some(_) => end + 1,
                    // A `\r` at the end of what arrived may be the first half of `\r\n`:
                    // wait for the next byte rather than read an empty line twice.
                    None => {
                        self.searched = end;
                        return false;
                    }
                }
            } else {
                end + 1
            };
            let line = &body[self.line_start..end];
            self.line_start = next;
            self.searched = next;
            if let Some(event) = self.line(line)
                && dispatch(event)
            {
                return true;
            }
        }
    }

    /// At the end of the body: a last line without its terminator, and an event without
    /// its blank line, still count (servers that close right after `data: [DONE]`).
    pub(crate) fn finish(&mut self, body: &[u8], mut dispatch: impl FnMut(Event) -> bool) {
        if self.feed(body, &mut dispatch) {
            return;
        }
        if self.line_start < body.len() {
            let line = body[self.line_start..]
                .strip_suffix(b"\r")
                .unwrap_or(&body[self.line_start..]);
            self.line_start = body.len();
            if let Some(event) = self.line(line)
                && dispatch(event)
            {
                return;
            }
        }
        if let Some(event) = self.line(b"") {
            dispatch(event);
        }
    }

    /// One line: a blank line dispatches, a field line accumulates.
    fn line(&mut self, line: &[u8]) -> Option<Event> {
        if line.is_empty() {
            let name = self.name.take();
            if !std::mem::take(&mut self.has_data) {
                return None;
            }
            return Some(Event {
                name,
                data: std::mem::take(&mut self.data),
            });
        }
        if line[0] == b':' {
            return None; // A comment (keep-alive).
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.has_data = true;
                self.data.push_str(&String::from_utf8_lossy(value));
            }
            b"event" => self.name = Some(String::from_utf8_lossy(value).into_owned()),
            // `id` and `retry` matter to a reconnecting reader; a model call never resumes.
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut framer = Framer::default();
        let mut body = Vec::new();
        let mut out = Vec::new();
        for chunk in chunks {
            body.extend_from_slice(chunk);
            framer.feed(&body, |e| {
                out.push(e);
                false
            });
        }
        framer.finish(&body, |e| {
            out.push(e);
            false
        });
        out
    }

    #[test]
    fn crlf_lone_cr_comments_and_multi_line_data_are_framed() {
        let events =
            all(&[b": keep-alive\r\nevent: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata:x\r\rdata: y\n\n"]);
        assert_eq!(
            events,
            [
                Event {
                    name: Some("a".into()),
                    data: "1\n2".into()
                },
                Event {
                    name: None,
                    data: "x".into()
                },
                Event {
                    name: None,
                    data: "y".into()
                },
            ]
        );
    }

    #[test]
    fn a_crlf_split_between_chunks_is_one_line_end() {
        let events = all(&[b"data: a\r", b"\n\r", b"\ndata: b\n\n"]);
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0].data, "a");
    }

    #[test]
    fn a_multibyte_character_split_across_chunks_is_read_whole() {
        let text = "data: h\u{e9}llo \u{1f600}\n\n".as_bytes();
        let events = all(&[&text[..8], &text[8..16], &text[16..]]);
        assert_eq!(events[0].data, "h\u{e9}llo \u{1f600}");
    }

    #[test]
    fn a_last_event_without_its_blank_line_counts_at_the_end() {
        assert_eq!(all(&[b"data: [DONE]"])[0].data, "[DONE]");
    }
}
