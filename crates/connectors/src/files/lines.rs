//! Cutting a byte range of a file into the lines it owns, from the bytes
//! as they arrive, without IO.
//!
//! A split of a line file is a byte range `start..end`; it owns the lines
//! that start in it. So a split that does not start the file skips the
//! line that began before it, by reading from `start - 1` to the first
//! newline, and every split reads past its `end` to finish its last line.
//! Whatever the split size, every line is read by exactly one split.

/// The next step of a [`Lines`].
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// A line, without its newline (nor a `\r` before it), starting at
    /// byte `offset`; the line after it starts at `next`.
    Line {
        /// Where the line starts in the file.
        offset: u64,
        /// Where the next line starts.
        next: u64,
        /// The line.
        bytes: &'a [u8],
    },
    /// More bytes are needed: [`Lines::push`] them.
    NeedMore,
    /// The range has no line left.
    Done,
}

/// The lines of `start..end` of a file of `size` bytes, from position
/// `offset` on.
#[derive(Debug)]
pub struct Lines {
    /// Bytes received, from file offset `base`.
    buf: Vec<u8>,
    base: u64,
    /// Index in `buf` of the next line's start, once aligned.
    pos: usize,
    /// The first line start at or after the range's start is found.
    aligned: bool,
    end: u64,
    size: u64,
}

impl Lines {
    /// The lines of `start..end` of a file of `size` bytes, going on at
    /// `offset` (a line start, or `start` before the first line). Returns
    /// it and the file offset to fetch bytes from.
    pub fn new(start: u64, end: u64, offset: u64, size: u64) -> (Self, u64) {
        let aligned = offset > start || start == 0;
        let from = if aligned { offset } else { start - 1 };
        let lines = Lines {
            buf: Vec::new(),
            base: from,
            pos: 0,
            aligned,
            end,
            size,
        };
        (lines, from)
    }

    /// The file's next bytes, after those pushed so far.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Every byte of the file has been pushed.
    fn eof(&self) -> bool {
        self.base + self.buf.len() as u64 >= self.size
    }

    /// The next line, or what stands in its way.
    pub fn next_line(&mut self) -> Next<'_> {
        if !self.aligned {
            match memchr(&self.buf[self.pos..]) {
                Some(i) => {
                    self.pos += i + 1;
                    self.aligned = true;
                }
                None if self.eof() => return Next::Done,
                None => {
                    self.pos = self.buf.len();
                    return Next::NeedMore;
                }
            }
        }
        let offset = self.base + self.pos as u64;
        if offset >= self.end || offset >= self.size {
            return Next::Done;
        }
        let rest = &self.buf[self.pos..];
        let (len, consumed) = match memchr(rest) {
            Some(i) => (i, i + 1),
            None if self.eof() => (rest.len(), rest.len()),
            None => return Next::NeedMore,
        };
        let line = &self.buf[self.pos..self.pos + len];
        let bytes = line.strip_suffix(b"\r").unwrap_or(line);
        self.pos += consumed;
        Next::Line {
            offset,
            next: self.base + self.pos as u64,
            bytes,
        }
    }
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every line of `start..end` of `file`, fed in pieces of `piece`
    /// bytes, with their offsets.
    fn read(file: &[u8], start: u64, end: u64, offset: u64, piece: usize) -> Vec<(u64, String)> {
        let (mut lines, from) = Lines::new(start, end, offset, file.len() as u64);
        let mut fed = from as usize;
        let mut out = Vec::new();
        loop {
            match lines.next_line() {
                Next::Line { offset, bytes, .. } => {
                    out.push((offset, String::from_utf8(bytes.to_vec()).unwrap()))
                }
                Next::NeedMore => {
                    let to = (fed + piece).min(file.len());
                    assert!(to > fed, "asked for bytes past the end");
                    lines.push(&file[fed..to]);
                    fed = to;
                }
                Next::Done => return out,
            }
        }
    }

    #[test]
    fn a_range_owns_the_lines_that_start_in_it() {
        let file = b"ab\ncd\r\nef\n\ngh";
        assert_eq!(read(file, 0, 4, 0, 1), [(0, "ab".into()), (3, "cd".into())]);
        assert_eq!(
            read(file, 4, 100, 4, 2),
            [(7, "ef".into()), (10, "".into()), (11, "gh".into())]
        );
        // A range that starts right at a line start owns that line.
        assert_eq!(read(file, 3, 4, 3, 5), [(3, "cd".into())]);
        // A range inside one line owns nothing.
        assert_eq!(read(file, 4, 6, 4, 1), []);
    }

    #[test]
    fn a_range_resumed_at_a_position_goes_on_from_it() {
        let file = b"ab\ncd\nef\n";
        assert_eq!(read(file, 0, 9, 6, 3), [(6, "ef".into())]);
        assert_eq!(read(file, 0, 9, 9, 3), []);
    }

    proptest! {
        /// Cut anywhere, in pieces of any size: every line is read once,
        /// in order, by the range it starts in.
        #[test]
        fn every_line_is_read_by_exactly_one_range(
            words in prop::collection::vec("[a-c]{0,4}", 0..20),
            trailing_newline: bool,
            split in 1u64..12,
            piece in 1usize..9,
        ) {
            let mut file = words.join("\n");
            if trailing_newline && !file.is_empty() {
                file.push('\n');
            }
            let file = file.into_bytes();
            let size = file.len() as u64;
            let mut got = Vec::new();
            let mut start = 0;
            while start < size {
                let end = (start + split).min(size);
                got.extend(read(&file, start, end, start, piece));
                start = end;
            }
            let mut want = Vec::new();
            let mut offset = 0u64;
            if !file.is_empty() {
                let text = String::from_utf8(file.clone()).unwrap();
                let body = text.strip_suffix('\n').unwrap_or(&text);
                for line in body.split('\n') {
                    want.push((offset, line.to_owned()));
                    offset += line.len() as u64 + 1;
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}
