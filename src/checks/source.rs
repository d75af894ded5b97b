//! Source preprocessing: split a candidate into what the rules look at, keeping every byte offset.
//!
//! A candidate is Python with C++/CUDA inside string literals. KernelBench's checker cuts each line
//! at the first `#` or `//` and runs regexes over the rest, so a `#` inside a string hides code, `a //
//! b` in Python hides the rest of the line, and "forward pass" in a docstring reads as a `pass`
//! statement. Here a small Python lexer separates code, comments and string literals instead, and a
//! small C++ lexer strips the comments and string literals of the embedded sources:
//!
//! - [`Source::python`]: the Python code with every comment and string literal's content blanked;
//! - [`Source::cpp`]: only the contents of string literals that are not bare statements (docstrings),
//!   with their C++ comments and C++ string/char literals blanked;
//! - [`Source::strings`]: the string literals themselves, for rules that need an argument's text.
//!
//! Blanked bytes become spaces and newlines stay, so an offset in a view is an offset in the source
//! and [`Source::line`] gives its 1-based line.

/// One Python string literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrLit {
    /// Offset of the opening quote (after any prefix such as `r` or `f`).
    pub start: usize,
    /// Offset just past the closing quote.
    pub end: usize,
    /// The text between the quotes, as written (escapes not decoded).
    pub content: String,
    /// True for a string that is a statement of its own (a docstring or a bare string).
    pub bare: bool,
}

/// A candidate's source, split into views of the same length.
#[derive(Debug, Clone)]
pub struct Source {
    /// The views the module doc describes, each as long as the source.
    pub python: String,
    pub cpp: String,
    pub strings: Vec<StrLit>,
    /// Offset of each line's first byte: an offset's line is a binary search away.
    line_starts: Vec<usize>,
}

impl Source {
    pub fn parse(code: &str) -> Source {
        let bytes = code.as_bytes();
        let mut python = bytes.to_vec();
        let mut cpp = vec![b' '; bytes.len()];
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' {
                cpp[i] = b'\n';
            }
        }
        let strings = lex_python(bytes, &mut python);
        for s in strings.iter().filter(|s| !s.bare) {
            let from = s.start + quote_len(bytes, s.start);
            let to = from + s.content.len();
            lex_cpp(&bytes[from..to], &mut cpp[from..to]);
        }
        let line_starts = std::iter::once(0)
            .chain(
                bytes
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b'\n')
                    .map(|(i, _)| i + 1),
            )
            .collect();
        Source {
            // Blanking replaces whole tokens byte by byte with ASCII spaces, so both views stay
            // valid UTF-8; the lossy conversion only guards against a bug in that invariant.
            python: String::from_utf8_lossy(&python).into_owned(),
            cpp: String::from_utf8_lossy(&cpp).into_owned(),
            strings,
            line_starts,
        }
    }

    /// 1-based line of a byte offset.
    pub fn line(&self, offset: usize) -> u32 {
        let idx = self.line_starts.partition_point(|&s| s <= offset);
        idx.max(1) as u32
    }

    /// The string literal starting at `offset` or after only whitespace from it.
    pub fn string_at(&self, offset: usize) -> Option<&StrLit> {
        let rest = self.python.get(offset..)?;
        let skip = rest.len() - rest.trim_start().len();
        let at = offset + skip;
        // A prefix (`r"..."`, `f'...'`) sits before the quote.
        self.strings
            .iter()
            .find(|s| s.start >= at && s.start <= at + 2)
    }
}

fn quote_len(bytes: &[u8], start: usize) -> usize {
    let q = bytes[start];
    if bytes.get(start + 1) == Some(&q) && bytes.get(start + 2) == Some(&q) {
        3
    } else {
        1
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

fn is_string_prefix(word: &[u8]) -> bool {
    let lower: Vec<u8> = word.iter().map(u8::to_ascii_lowercase).collect();
    matches!(
        lower.as_slice(),
        b"r" | b"u" | b"f" | b"b" | b"br" | b"rb" | b"fr" | b"rf"
    )
}

/// Lex Python: blank comments and string contents in `out`, return the string literals.
fn lex_python(bytes: &[u8], out: &mut [u8]) -> Vec<StrLit> {
    let mut strings: Vec<StrLit> = Vec::new();
    let mut i = 0;
    let mut depth: usize = 0;
    // True while only whitespace (or a prefix) has been seen on the current logical line.
    let mut line_start = true;
    // Index into `strings` of a string that began a logical line and may be a bare statement.
    let mut candidate: Option<usize> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out[i] = b' ';
                    i += 1;
                }
            }
            b'\n' => {
                if depth == 0 {
                    if let Some(idx) = candidate.take() {
                        strings[idx].bare = true;
                    }
                    line_start = true;
                }
                i += 1;
            }
            b'\\' if bytes.get(i + 1) == Some(&b'\n') => {
                // Explicit line continuation: the logical line goes on.
                i += 2;
            }
            b'\'' | b'"' => {
                let lit = lex_string(bytes, i, out);
                i = lit.end;
                // A string after a bare one (`"a" "b"`, implicit concatenation) keeps the
                // statement bare; any other token before it has cleared `candidate` already.
                if line_start && depth == 0 {
                    candidate = Some(strings.len());
                }
                line_start = false;
                strings.push(lit);
            }
            _ if is_ident(b) && (i == 0 || !is_ident(bytes[i - 1])) => {
                let start = i;
                while i < bytes.len() && is_ident(bytes[i]) {
                    i += 1;
                }
                if matches!(bytes.get(i), Some(b'\'' | b'"')) && is_string_prefix(&bytes[start..i])
                {
                    // The prefix belongs to the string; the loop lexes the quote next.
                    continue;
                }
                line_start = false;
                candidate = None;
            }
            b' ' | b'\t' | b'\r' | b'\x0c' => i += 1,
            _ => {
                match b {
                    b'(' | b'[' | b'{' => depth += 1,
                    b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                // `;` ends a statement: a string before it stays bare, one after it is a new line.
                if b == b';' && depth == 0 {
                    if let Some(idx) = candidate.take() {
                        strings[idx].bare = true;
                    }
                    line_start = true;
                } else {
                    line_start = false;
                    candidate = None;
                }
                i += 1;
            }
        }
    }
    if let Some(idx) = candidate {
        strings[idx].bare = true;
    }
    strings
}

/// Lex one string literal whose opening quote is at `start`; blank its content in `out`.
fn lex_string(bytes: &[u8], start: usize, out: &mut [u8]) -> StrLit {
    let q = bytes[start];
    let triple = quote_len(bytes, start) == 3;
    let open = if triple { 3 } else { 1 };
    let mut i = start + open;
    let content_end;
    loop {
        if i >= bytes.len() {
            content_end = bytes.len();
            break;
        }
        let b = bytes[i];
        if b == b'\\' {
            // In raw strings too, a backslash keeps the next character from closing the string.
            i = (i + 2).min(bytes.len());
            continue;
        }
        if b == q && (!triple || (bytes.get(i + 1) == Some(&q) && bytes.get(i + 2) == Some(&q))) {
            content_end = i;
            break;
        }
        if b == b'\n' && !triple {
            // Unterminated single-quoted string: Python rejects it; stop at the line end.
            content_end = i;
            break;
        }
        i += 1;
    }
    let end = if content_end < bytes.len() && bytes[content_end] != b'\n' {
        content_end + open
    } else {
        content_end
    };
    for (j, o) in out
        .iter_mut()
        .enumerate()
        .take(content_end)
        .skip(start + open)
    {
        if bytes[j] != b'\n' {
            *o = b' ';
        }
    }
    StrLit {
        start,
        end,
        content: String::from_utf8_lossy(&bytes[start + open..content_end]).into_owned(),
        bare: false,
    }
}

/// Lex C++ text: copy code into `out`, leave comments and string/char literals blank.
fn lex_cpp(text: &[u8], out: &mut [u8]) {
    let mut i = 0;
    while i < text.len() {
        let b = text[i];
        match b {
            b'/' if text.get(i + 1) == Some(&b'/') => {
                while i < text.len() && text[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if text.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < text.len() && !(text[i] == b'*' && text.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(text.len());
            }
            b'"' | b'\'' => {
                // Keep the quotes so `"..."` still reads as a literal; blank what is inside.
                out[i] = b;
                i += 1;
                while i < text.len() && text[i] != b && text[i] != b'\n' {
                    if text[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                if i < text.len() && text[i] == b {
                    out[i] = b;
                    i += 1;
                }
            }
            _ => {
                out[i] = b;
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_in_a_string_is_not_a_comment_and_floor_division_is_code() {
        let s = Source::parse("x = \"#not a comment\"; y = a // b  # real\nz = 1\n");
        let blank = " ".repeat("#not a comment".len());
        assert_eq!(
            s.python,
            format!("x = \"{blank}\"; y = a // b        \nz = 1\n")
        );
        assert_eq!(s.line(s.python.find("z").unwrap()), 2);
    }

    #[test]
    fn docstrings_are_bare_and_kernel_sources_are_not() {
        let code = "def f():\n    \"\"\"Do the forward pass.\"\"\"\n    return 1\nsrc = r'''\n__global__ void k() {} // pass\n/* try: */ int x = 1;\n'''\n";
        let s = Source::parse(code);
        assert!(!s.python.contains("pass"));
        assert_eq!(s.strings.len(), 2);
        assert!(s.strings[0].bare);
        assert!(!s.strings[1].bare);
        assert!(s.cpp.contains("__global__ void k() {}"));
        assert!(
            !s.cpp.contains("pass") && !s.cpp.contains("try"),
            "{}",
            s.cpp
        );
        assert!(!s.cpp.contains("forward"));
        assert_eq!(s.line(s.cpp.find("int x").unwrap()), 6);
    }

    #[test]
    fn string_arguments_inside_brackets_are_not_bare() {
        let s = Source::parse("load(\n    'a',\n    'b'\n)\n");
        assert!(s.strings.iter().all(|l| !l.bare));
        let s = Source::parse("x = 1; 'doc'\n");
        assert!(s.strings[0].bare);
    }

    #[test]
    fn prefixes_escapes_and_cpp_strings() {
        let s = Source::parse(
            "a = rb'\\'' + f\"{x}\" + 'it''s'\nc = \"\"\"printf(\"// not a comment\"); // yes\n\"\"\"\n",
        );
        assert_eq!(s.strings.len(), 5);
        assert_eq!(s.strings[0].content, "\\'");
        assert!(s.cpp.contains("printf(\"                \");"), "{}", s.cpp);
        assert!(!s.cpp.contains("yes"));
    }

    #[test]
    fn unterminated_strings_do_not_run_away() {
        let s = Source::parse("x = 'abc\npass\n");
        assert!(s.python.contains("pass"));
        let s = Source::parse("x = '''abc");
        assert_eq!(s.strings[0].content, "abc");
    }
}
