//! Extracting the candidate code from an LLM answer.
//!
//! KernelBench's rule (`extract_first_code`): the first fenced block, its language tag (`python`,
//! `cpp`) stripped, surrounding whitespace stripped. Made robust for the answers real models write:
//!
//! - the block that defines `class ModelNew` wins over an earlier block that does not (a `pip install`
//!   line or a snippet of the reference before the solution); otherwise the first non-empty block;
//! - fences of backticks or tildes, three or more, closed by a fence of the same character at least as
//!   long (so a block may contain a shorter fence); any language tag is dropped; an indented fence (in a
//!   list) has its indentation removed from every line of the block;
//! - an unterminated last block runs to the end of the answer (answers cut off by `max_tokens`);
//! - CRLF line ends;
//! - `<think>...</think>` (or `<thinking>`) reasoning: code inside it is used only when no block exists
//!   outside it. A closing tag with no opening one (chat templates that put `<think>` in the prompt)
//!   makes everything before it reasoning; an opening tag never closed runs to the end.
//!
//! When this finds no usable block, KernelBench's own rule is tried as it is (fences in the middle of
//! a line). Answers without any fenced block give `None`, as in KernelBench.

/// The candidate code in an answer, or `None` when it has no usable code block.
pub fn extract_code(answer: &str) -> Option<String> {
    let text = answer.replace("\r\n", "\n");
    let thinking = think_spans(&text);
    let blocks = fenced_blocks(&text);
    let outside: Vec<&Block> = blocks
        .iter()
        .filter(|b| !thinking.iter().any(|s| s.contains(&b.start)))
        .collect();
    let candidates: Vec<&Block> = if outside.is_empty() {
        blocks.iter().collect()
    } else {
        outside
    };
    let usable = || candidates.iter().filter(|b| !b.code.is_empty());
    usable()
        .find(|b| defines_model_new(&b.code))
        .or_else(|| usable().next())
        .map(|b| b.code.clone())
        .or_else(|| kernelbench_rule(&text))
}

/// KernelBench's own rule, for answers whose fences are not at the start of a line
/// (`Sure! ```python`): the text between the first two "```", stripped, a leading `python` or
/// `cpp` removed. Never worse than KernelBench on an answer it can read.
fn kernelbench_rule(text: &str) -> Option<String> {
    let (_, rest) = text.split_once("```")?;
    let (inner, _) = rest.split_once("```")?;
    let mut code = inner.trim();
    for tag in ["python", "cpp"] {
        if let Some(c) = code.strip_prefix(tag) {
            code = c.trim();
        }
    }
    (!code.is_empty()).then(|| code.to_string())
}

/// One fenced block: where its opening fence starts (byte offset) and its cleaned content.
struct Block {
    start: usize,
    code: String,
}

/// An opening or closing fence line.
struct Fence<'a> {
    indent: usize,
    ch: char,
    len: usize,
    /// What follows the fence characters on the line (language tag, or code on a closing fence).
    rest: &'a str,
}

fn parse_fence(line: &str) -> Option<Fence<'_>> {
    let indent = leading_ws(line).len();
    let trimmed = &line[indent..];
    let ch = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.chars().take_while(|c| *c == ch).count();
    if len < 3 {
        return None;
    }
    // Fence characters are ASCII, so `len` is also a byte length.
    Some(Fence {
        indent,
        ch,
        len,
        rest: &trimmed[len..],
    })
}

/// A language tag is one word (`python`, `c++`, `cuda`, `{.py}`); anything else after an opening
/// fence (`import torch`) is the block's first line of code, which KernelBench's regex keeps too.
fn is_language_tag(info: &str) -> bool {
    let info = info.trim();
    info.is_empty()
        || info
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_+-.#{}".contains(c))
}

fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = line_spans(text).peekable();
    while let Some((start, line)) = lines.next() {
        let Some(open) = parse_fence(line) else {
            continue;
        };
        let mut body: Vec<&str> = Vec::new();
        if !is_language_tag(open.rest) {
            body.push(open.rest);
        }
        let mut closed = false;
        for (_, line) in lines.by_ref() {
            if let Some(close) = parse_fence(line)
                && close.ch == open.ch
                && close.len >= open.len
                && close.rest.trim().is_empty()
            {
                closed = true;
                break;
            }
            body.push(line);
        }
        if !closed {
            strip_trailing_fence(&mut body, open.ch, open.len);
        }
        blocks.push(Block {
            start,
            code: clean(&body, open.indent),
        });
    }
    blocks
}

/// An unterminated block whose last line ends in the fence (`return x```` written on one line) is
/// closed there rather than keeping the fence characters in the code.
fn strip_trailing_fence(body: &mut [&str], ch: char, len: usize) {
    let fence: String = std::iter::repeat_n(ch, len).collect();
    if let Some(last) = body.iter_mut().rev().find(|l| !l.trim().is_empty())
        && let Some(code) = last.trim_end().strip_suffix(fence.as_str())
    {
        *last = code;
    }
}

/// Removes the fence's indentation from every line, then the indentation all lines share, blank
/// lines at either end and trailing whitespace. KernelBench strips the block as one string; stripping
/// only the first line's indentation would break a block that is indented as a whole.
fn clean(body: &[&str], fence_indent: usize) -> String {
    let dedented: Vec<&str> = body
        .iter()
        .map(|line| &line[leading_ws(line).len().min(fence_indent)..])
        .collect();
    let non_blank = || dedented.iter().filter(|l| !l.trim().is_empty());
    let common = non_blank().map(|l| leading_ws(l)).reduce(|a, b| {
        let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        &a[..n]
    });
    let Some(common) = common else {
        return String::new();
    };
    let first = dedented.iter().position(|l| !l.trim().is_empty());
    let last = dedented.iter().rposition(|l| !l.trim().is_empty());
    let (Some(first), Some(last)) = (first, last) else {
        return String::new();
    };
    dedented[first..=last]
        .iter()
        .map(|l| l.strip_prefix(common).unwrap_or(l.trim_start()))
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

fn leading_ws(line: &str) -> &str {
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// Lines with the byte offset where each starts (without the `\n`).
fn line_spans(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    text.split('\n').map(move |line| {
        let start = offset;
        offset += line.len() + 1;
        (start, line)
    })
}

fn defines_model_new(code: &str) -> bool {
    code.lines().any(|line| {
        line.trim_start()
            .strip_prefix("class")
            .filter(|r| r.starts_with([' ', '\t']))
            .map(|r| r.trim_start())
            .and_then(|r| r.strip_prefix("ModelNew"))
            .is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    })
}

/// Byte ranges of reasoning (`<think>...</think>`, `<thinking>...</thinking>`).
fn think_spans(text: &str) -> Vec<std::ops::Range<usize>> {
    let mut spans = Vec::new();
    for (open, close) in [("<think>", "</think>"), ("<thinking>", "</thinking>")] {
        let mut from = 0;
        // A close before any open: the template opened the reasoning in the prompt.
        if let Some(c) = text.find(close)
            && text.find(open).is_none_or(|o| o > c)
        {
            spans.push(0..c + close.len());
            from = c + close.len();
        }
        while let Some(o) = text[from..].find(open).map(|o| o + from) {
            let end = text[o..]
                .find(close)
                .map_or(text.len(), |c| o + c + close.len());
            spans.push(o..end);
            from = end;
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::extract_code;

    fn x(answer: &str) -> Option<String> {
        extract_code(answer)
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn first_block_with_python_tag() {
        let a =
            "Here is the code:\n```python\nimport torch\n\nclass ModelNew:\n    pass\n```\nDone.";
        assert_eq!(x(a), some("import torch\n\nclass ModelNew:\n    pass"));
    }

    #[test]
    fn any_language_tag_is_stripped() {
        for tag in ["cpp", "cuda", "c++", "py", "Python", "{.python}", ""] {
            let a = format!("```{tag}\nx = 1\n```");
            assert_eq!(x(&a), some("x = 1"), "tag {tag:?}");
        }
        assert_eq!(x("```python   \nx = 1\n```"), some("x = 1"));
    }

    #[test]
    fn code_on_the_fence_line_is_kept() {
        assert_eq!(
            x("```import torch\nx = 1\n```"),
            some("import torch\nx = 1")
        );
    }

    #[test]
    fn surrounding_blank_lines_and_trailing_space_go() {
        assert_eq!(x("```\n\n\n  x = 1  \n\n```"), some("x = 1"));
    }

    #[test]
    fn first_block_when_none_defines_model_new() {
        let a = "```bash\npip install torch\n```\n```python\nprint(1)\n```";
        assert_eq!(x(a), some("pip install torch"));
    }

    #[test]
    fn block_defining_model_new_wins() {
        let a = "Reference:\n```python\nclass Model(nn.Module):\n    pass\n```\nMine:\n```python\nclass ModelNew(nn.Module):\n    pass\n```\n```python\nclass ModelNew(nn.Module):\n    second = True\n```";
        assert_eq!(x(a), some("class ModelNew(nn.Module):\n    pass"));
    }

    #[test]
    fn model_new_must_be_the_class_name() {
        let a = "```\nclass ModelNewer:\n    pass\n```\n```\n# class ModelNew is below\nclassModelNew = 1\n```";
        assert_eq!(x(a), some("class ModelNewer:\n    pass"));
        let a = "```\nx = 1\n```\n```\n  class  ModelNew :\n    pass\n```";
        assert_eq!(x(a), some("class  ModelNew :\n  pass"));
    }

    #[test]
    fn tilde_fences() {
        assert_eq!(x("~~~python\nx = 1\n~~~\n"), some("x = 1"));
        // A backtick fence does not close a tilde block.
        assert_eq!(
            x("~~~\nx = '```'\n```\ny = 2\n~~~"),
            some("x = '```'\n```\ny = 2")
        );
    }

    #[test]
    fn longer_fence_contains_shorter_one() {
        let a = "````python\ndoc = \"\"\"\n```\nexample\n```\n\"\"\"\n````\n";
        assert_eq!(x(a), some("doc = \"\"\"\n```\nexample\n```\n\"\"\""));
    }

    #[test]
    fn closing_fence_needs_nothing_after_it() {
        // "```python" inside a block opens nothing and closes nothing.
        let a = "```\nx = 1\n```python\ny = 2\n```";
        assert_eq!(x(a), some("x = 1\n```python\ny = 2"));
    }

    #[test]
    fn unterminated_last_block_runs_to_the_end() {
        assert_eq!(
            x("Sure.\n```python\nimport torch\nclass ModelNew:\n    pass\n"),
            some("import torch\nclass ModelNew:\n    pass")
        );
        assert_eq!(x("```python\nx = 1\ny = 2```"), some("x = 1\ny = 2"));
        assert_eq!(x("```python\nx = 1\ny = 2```\n\n"), some("x = 1\ny = 2"));
    }

    #[test]
    fn block_indented_as_a_whole_is_dedented() {
        let a = "```\n    x = 1\n    if x:\n        y = 2\n\n```";
        assert_eq!(x(a), some("x = 1\nif x:\n    y = 2"));
    }

    #[test]
    fn crlf_line_ends() {
        assert_eq!(
            x("Code:\r\n```python\r\nx = 1\r\n\r\ny = 2\r\n```\r\n"),
            some("x = 1\n\ny = 2")
        );
    }

    #[test]
    fn indented_fence_is_dedented() {
        let a = "1. The code:\n   ```python\n   class ModelNew:\n       pass\n   ```\n";
        assert_eq!(x(a), some("class ModelNew:\n    pass"));
        // Lines indented less than the fence lose only what they have.
        assert_eq!(
            x("    ```\n  x = 1\n    y = 2\n    ```"),
            some("x = 1\ny = 2")
        );
    }

    #[test]
    fn think_block_code_is_ignored_when_code_exists_outside() {
        let a = "<think>\nMaybe:\n```python\nclass ModelNew:\n    draft = 1\n```\n</think>\nFinal:\n```python\nclass ModelNew:\n    final = 1\n```";
        assert_eq!(x(a), some("class ModelNew:\n    final = 1"));
        // Outside code wins even when only the reasoning defines ModelNew.
        let a = "<think>\n```\nclass ModelNew: pass\n```\n</think>\n```\nx = 1\n```";
        assert_eq!(x(a), some("x = 1"));
    }

    #[test]
    fn think_block_code_is_used_when_nothing_is_outside() {
        let a = "<think>\n```python\nclass ModelNew:\n    pass\n```\n</think>\nI could not finish.";
        assert_eq!(x(a), some("class ModelNew:\n    pass"));
    }

    #[test]
    fn think_closed_without_opening_and_opened_without_closing() {
        let a = "reasoning\n```\ndraft = 1\n```\n</think>\n```\nfinal = 1\n```";
        assert_eq!(x(a), some("final = 1"));
        let a = "```\nfinal = 1\n```\n<think>\n```\nclass ModelNew: pass\n```";
        assert_eq!(x(a), some("final = 1"));
        let a = "<thinking>\n```\na = 1\n```\n</thinking>\n```\nb = 2\n```\n<think>x</think>";
        assert_eq!(x(a), some("b = 2"));
    }

    #[test]
    fn no_usable_code_is_none() {
        assert_eq!(x(""), None);
        assert_eq!(x("I cannot help with that."), None);
        assert_eq!(x("class ModelNew:\n    pass\n"), None);
        assert_eq!(x("``\nx\n``"), None);
        assert_eq!(x("```python\n```"), None);
        assert_eq!(x("```python\n   \n\n```\ntext"), None);
        assert_eq!(x("```python"), None);
    }

    #[test]
    fn fence_in_the_middle_of_a_line_falls_back_to_kernelbench_rule() {
        assert_eq!(
            x("Sure! ```python\nimport torch\nclass ModelNew: pass\n```"),
            some("import torch\nclass ModelNew: pass")
        );
        assert_eq!(x("Use ```cpp x = 1;``` here."), some("x = 1;"));
    }

    #[test]
    fn empty_first_block_falls_through_to_next() {
        assert_eq!(x("```\n```\n```\nx = 1\n```"), some("x = 1"));
    }

    #[test]
    fn text_after_block_is_not_code() {
        let a = "```python\nx = 1\n```\nThis kernel fuses ops.\n```";
        assert_eq!(x(a), some("x = 1"));
    }

    #[test]
    fn multibyte_text_is_safe() {
        assert_eq!(x("ÄÖÜ ```\n```py\nπ = 3.14 # ≈\n```"), some("π = 3.14 # ≈"));
        assert_eq!(
            x("<think>日本語</think>\n```\nx = '→'\n```"),
            some("x = '→'")
        );
    }
}
