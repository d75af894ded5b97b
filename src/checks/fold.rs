//! Constant folding over a tree-sitter-python tree: the value of an expression that is a constant
//! however it is spelled (`"_get" + "frame"`, `"".join(["thre", "ading"])`, `"%s%s" % ("f_", "back")`,
//! `"emarf_teg_"[::-1]`, `f"gc"`, a name assigned such a value), so the parsed rules
//! ([`super::parsed`]) see the name a candidate builds, not the pieces it builds it from.
//!
//! Folding is bounded (depth, string length, list length): past a bound an expression is "not a
//! constant", which the rules treat as a computed name, never as harmless.

use std::collections::HashMap;

use tree_sitter::Node;

/// Longest folded string kept; anything longer is not a name a rule looks for.
pub const MAX_LEN: usize = 4096;
/// Deepest expression folded (a chain of `+` nests one level per term).
const MAX_DEPTH: u32 = 64;
/// Most items in a folded list or tuple.
const MAX_ITEMS: usize = 256;
/// Most values a name may be known to hold (one per assignment).
const MAX_BINDINGS: usize = 16;

/// A folded constant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Int(i64),
    List(Vec<Value>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The folder of one file: its source and what each simple name is known to hold.
pub struct Folder<'a> {
    src: &'a [u8],
    /// name -> the constant values assigned to it (in source order); `None` once any assignment
    /// to it is not a constant.
    names: HashMap<String, Option<Vec<Value>>>,
}

impl<'a> Folder<'a> {
    pub fn new(src: &'a [u8]) -> Self {
        Folder {
            src,
            names: HashMap::new(),
        }
    }

    pub fn text(&self, node: Node) -> &'a str {
        node.utf8_text(self.src).unwrap_or("")
    }

    /// Record `name = value` (or `name += value` when `augmented`), in source order.
    pub fn bind(&mut self, name: &str, value: Node, augmented: bool) {
        let folded = self.fold(value);
        let entry = self
            .names
            .entry(name.to_string())
            .or_insert(Some(Vec::new()));
        let Some(values) = entry.as_mut() else { return };
        match (folded, augmented) {
            (Some(v), false) if values.len() < MAX_BINDINGS => values.push(v),
            (Some(Value::Str(tail)), true) => {
                let extended: Vec<Value> = values
                    .iter()
                    .filter_map(|p| p.as_str().map(|p| format!("{p}{tail}")))
                    .filter(|s| s.len() <= MAX_LEN)
                    .map(Value::Str)
                    .collect();
                if extended.is_empty() || values.len() + extended.len() > MAX_BINDINGS {
                    *entry = None;
                } else {
                    values.extend(extended);
                }
            }
            _ => *entry = None,
        }
    }

    /// Every constant value `node` may have: one for a literal expression, one per assignment for a
    /// name bound several times; empty when it is not a constant.
    pub fn values(&self, node: Node) -> Vec<Value> {
        let node = unparen(node);
        if node.kind() == "identifier" {
            return match self.names.get(self.text(node)) {
                Some(Some(values)) => values.clone(),
                _ => Vec::new(),
            };
        }
        self.fold(node).into_iter().collect()
    }

    /// The strings `node` may fold to.
    pub fn strings(&self, node: Node) -> Vec<String> {
        self.values(node)
            .into_iter()
            .filter_map(|v| match v {
                Value::Str(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    pub fn fold(&self, node: Node) -> Option<Value> {
        self.fold_at(node, 0)
    }

    fn fold_at(&self, node: Node, depth: u32) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        let d = depth + 1;
        match node.kind() {
            "string" => string_value(node, self.src).map(Value::Str),
            "concatenated_string" => {
                let mut out = String::new();
                let mut cursor = node.walk();
                for part in node.named_children(&mut cursor) {
                    out.push_str(self.fold_at(part, d)?.as_str()?);
                }
                bounded(out)
            }
            "integer" => parse_int(self.text(node)).map(Value::Int),
            "unary_operator" => {
                let arg = node.child_by_field_name("argument")?;
                let op = node.child_by_field_name("operator")?;
                match (self.text(op), self.fold_at(arg, d)?) {
                    ("-", Value::Int(i)) => i.checked_neg().map(Value::Int),
                    ("+", Value::Int(i)) => Some(Value::Int(i)),
                    _ => None,
                }
            }
            "parenthesized_expression" => self.fold_at(node.named_child(0)?, d),
            "list" | "tuple" => {
                let mut items = Vec::new();
                let mut cursor = node.walk();
                for item in node.named_children(&mut cursor) {
                    if items.len() >= MAX_ITEMS {
                        return None;
                    }
                    items.push(self.fold_at(item, d)?);
                }
                Some(Value::List(items))
            }
            "identifier" => match self.names.get(self.text(node)) {
                // A name folds only when every assignment to it gave the same constant.
                Some(Some(values))
                    if !values.is_empty() && values.iter().all(|v| *v == values[0]) =>
                {
                    Some(values[0].clone())
                }
                _ => None,
            },
            "binary_operator" => {
                let left = self.fold_at(node.child_by_field_name("left")?, d)?;
                let right = self.fold_at(node.child_by_field_name("right")?, d)?;
                let op = self.text(node.child_by_field_name("operator")?);
                binary(op, left, right)
            }
            "subscript" => {
                let value = self.fold_at(node.child_by_field_name("value")?, d)?;
                let index = node.child_by_field_name("subscript")?;
                if index.kind() == "slice" {
                    let (start, stop, step) = self.slice_bounds(index, d)?;
                    slice(value, start, stop, step)
                } else {
                    let Value::Int(i) = self.fold_at(index, d)? else {
                        return None;
                    };
                    item(value, i)
                }
            }
            "call" => self.fold_call(node, d),
            _ => None,
        }
    }

    /// `[start:stop:step]`: each part an integer constant or absent.
    fn slice_bounds(&self, slice: Node, d: u32) -> Option<(Option<i64>, Option<i64>, Option<i64>)> {
        let mut parts: [Option<i64>; 3] = [None, None, None];
        let mut at = 0;
        let mut cursor = slice.walk();
        for child in slice.children(&mut cursor) {
            if child.kind() == ":" {
                at += 1;
                if at > 2 {
                    return None;
                }
                continue;
            }
            let Value::Int(i) = self.fold_at(child, d)? else {
                return None;
            };
            parts[at] = Some(i);
        }
        Some((parts[0], parts[1], parts[2]))
    }

    fn fold_call(&self, node: Node, d: u32) -> Option<Value> {
        let function = node.child_by_field_name("function")?;
        let args_node = node.child_by_field_name("arguments")?;
        if args_node.kind() != "argument_list" {
            return None;
        }
        let mut args = Vec::new();
        let mut cursor = args_node.walk();
        for a in args_node.named_children(&mut cursor) {
            if matches!(
                a.kind(),
                "keyword_argument" | "list_splat" | "dictionary_splat"
            ) {
                return None;
            }
            args.push(a);
        }
        match function.kind() {
            "identifier" => {
                let name = self.text(function);
                match (name, args.as_slice()) {
                    ("str", [a]) => match self.fold_at(*a, d)? {
                        Value::Int(i) => Some(Value::Str(i.to_string())),
                        v @ Value::Str(_) => Some(v),
                        Value::List(_) => None,
                    },
                    ("chr", [a]) => {
                        let Value::Int(i) = self.fold_at(*a, d)? else {
                            return None;
                        };
                        let c = char::from_u32(u32::try_from(i).ok()?)?;
                        Some(Value::Str(c.to_string()))
                    }
                    ("reversed", [a]) => match self.fold_at(*a, d)? {
                        Value::Str(s) => Some(Value::Str(s.chars().rev().collect())),
                        Value::List(mut l) => {
                            l.reverse();
                            Some(Value::List(l))
                        }
                        Value::Int(_) => None,
                    },
                    ("list" | "tuple", [a]) => match self.fold_at(*a, d)? {
                        Value::Str(s) => Some(Value::List(
                            s.chars().map(|c| Value::Str(c.to_string())).collect(),
                        )),
                        l @ Value::List(_) => Some(l),
                        Value::Int(_) => None,
                    },
                    _ => None,
                }
            }
            "attribute" => {
                let method = self.text(function.child_by_field_name("attribute")?);
                let receiver = self.fold_at(function.child_by_field_name("object")?, d)?;
                let Value::Str(s) = receiver else { return None };
                let folded: Vec<Value> = args
                    .iter()
                    .map(|a| self.fold_at(*a, d))
                    .collect::<Option<_>>()?;
                string_method(&s, method, &folded)
            }
            _ => None,
        }
    }
}

fn unparen(mut node: Node) -> Node {
    while node.kind() == "parenthesized_expression" {
        match node.named_child(0) {
            Some(inner) => node = inner,
            None => break,
        }
    }
    node
}

fn bounded(s: String) -> Option<Value> {
    (s.len() <= MAX_LEN).then_some(Value::Str(s))
}

fn parse_int(text: &str) -> Option<i64> {
    let t: String = text.chars().filter(|c| *c != '_').collect();
    let lower = t.to_ascii_lowercase();
    if let Some(h) = lower.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = lower.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else if let Some(b) = lower.strip_prefix("0b") {
        i64::from_str_radix(b, 2).ok()
    } else {
        lower.parse().ok()
    }
}

fn binary(op: &str, left: Value, right: Value) -> Option<Value> {
    match (op, left, right) {
        ("+", Value::Str(a), Value::Str(b)) => bounded(a + &b),
        ("+", Value::Int(a), Value::Int(b)) => a.checked_add(b).map(Value::Int),
        ("-", Value::Int(a), Value::Int(b)) => a.checked_sub(b).map(Value::Int),
        ("*", Value::Int(a), Value::Int(b)) => a.checked_mul(b).map(Value::Int),
        ("+", Value::List(mut a), Value::List(b)) if a.len() + b.len() <= MAX_ITEMS => {
            a.extend(b);
            Some(Value::List(a))
        }
        ("*", Value::Str(s), Value::Int(n)) | ("*", Value::Int(n), Value::Str(s)) => {
            let n = usize::try_from(n.max(0)).ok()?;
            if s.len().checked_mul(n)? > MAX_LEN {
                return None;
            }
            Some(Value::Str(s.repeat(n)))
        }
        ("%", Value::Str(format), args) => percent(&format, args),
        _ => None,
    }
}

/// `format % args` for `%s`, `%d`, `%r`-free formats; anything else is not folded.
fn percent(format: &str, args: Value) -> Option<Value> {
    let args = match args {
        Value::List(items) => items,
        one => vec![one],
    };
    let mut args = args.into_iter();
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '%' => out.push('%'),
            's' | 'd' | 'i' => match args.next()? {
                Value::Str(s) => out.push_str(&s),
                Value::Int(i) => out.push_str(&i.to_string()),
                Value::List(_) => return None,
            },
            _ => return None,
        }
    }
    if args.next().is_some() {
        return None;
    }
    bounded(out)
}

fn item(value: Value, index: i64) -> Option<Value> {
    match value {
        Value::Str(s) => {
            let chars: Vec<char> = s.chars().collect();
            let i = norm_index(index, chars.len())?;
            Some(Value::Str(chars[i].to_string()))
        }
        Value::List(items) => {
            let i = norm_index(index, items.len())?;
            items.into_iter().nth(i)
        }
        Value::Int(_) => None,
    }
}

fn norm_index(index: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let i = if index < 0 { index + len } else { index };
    usize::try_from(i).ok().filter(|_| (0..len).contains(&i))
}

/// Python's slice semantics on a sequence of `len` items.
fn slice_indices(
    len: usize,
    start: Option<i64>,
    stop: Option<i64>,
    step: Option<i64>,
) -> Option<Vec<usize>> {
    let len = i64::try_from(len).ok()?;
    let step = step.unwrap_or(1);
    if step == 0 {
        return None;
    }
    let clamp = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
    let adjust = |v: i64| if v < 0 { v + len } else { v };
    let mut out = Vec::new();
    if step > 0 {
        let mut i = clamp(start.map_or(0, adjust), 0, len);
        let end = clamp(stop.map_or(len, adjust), 0, len);
        while i < end {
            out.push(i as usize);
            i += step;
        }
    } else {
        let mut i = clamp(start.map_or(len - 1, adjust), -1, len - 1);
        let end = clamp(stop.map_or(-1, adjust), -1, len - 1);
        while i > end {
            out.push(i as usize);
            i += step;
        }
    }
    Some(out)
}

fn slice(value: Value, start: Option<i64>, stop: Option<i64>, step: Option<i64>) -> Option<Value> {
    match value {
        Value::Str(s) => {
            let chars: Vec<char> = s.chars().collect();
            let picked = slice_indices(chars.len(), start, stop, step)?;
            Some(Value::Str(picked.into_iter().map(|i| chars[i]).collect()))
        }
        Value::List(items) => {
            let picked = slice_indices(items.len(), start, stop, step)?;
            Some(Value::List(
                picked.into_iter().map(|i| items[i].clone()).collect(),
            ))
        }
        Value::Int(_) => None,
    }
}

fn string_method(s: &str, method: &str, args: &[Value]) -> Option<Value> {
    let str_arg = |i: usize| args.get(i).and_then(Value::as_str);
    match (method, args.len()) {
        ("join", 1) => {
            let parts: Vec<String> = match &args[0] {
                Value::List(items) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<_>>()?,
                Value::Str(t) => t.chars().map(|c| c.to_string()).collect(),
                Value::Int(_) => return None,
            };
            bounded(parts.join(s))
        }
        ("lower", 0) => bounded(s.to_lowercase()),
        ("upper", 0) => bounded(s.to_uppercase()),
        ("strip", 0) => bounded(s.trim().to_string()),
        ("lstrip", 0) => bounded(s.trim_start().to_string()),
        ("rstrip", 0) => bounded(s.trim_end().to_string()),
        ("strip", 1) => bounded(
            s.trim_matches(|c| str_arg(0).is_some_and(|a| a.contains(c)))
                .to_string(),
        ),
        ("replace", 2) => bounded(s.replace(str_arg(0)?, str_arg(1)?)),
        ("encode" | "decode", 0) => bounded(s.to_string()),
        ("casefold", 0) => bounded(s.to_lowercase()),
        ("swapcase", 0) => bounded(
            s.chars()
                .flat_map(|c| {
                    if c.is_uppercase() {
                        c.to_lowercase().collect::<Vec<_>>()
                    } else {
                        c.to_uppercase().collect()
                    }
                })
                .collect(),
        ),
        ("format", _) => format_positional(s, args),
        _ => None,
    }
}

/// `"{}{}".format(a, b)` and `"{0}{1}"` with constant arguments; format specs are not folded.
fn format_positional(format: &str, args: &[Value]) -> Option<Value> {
    let mut out = String::new();
    let mut next = 0usize;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut field = String::new();
                loop {
                    match chars.next()? {
                        '}' => break,
                        ch => field.push(ch),
                    }
                }
                let index = if field.is_empty() {
                    next += 1;
                    next - 1
                } else {
                    field.parse().ok()?
                };
                match args.get(index)? {
                    Value::Str(s) => out.push_str(s),
                    Value::Int(i) => out.push_str(&i.to_string()),
                    Value::List(_) => return None,
                }
            }
            ch => out.push(ch),
        }
    }
    bounded(out)
}

/// The value of a string literal: its escapes decoded (unless raw); `None` for an f-string with a
/// hole (`{expr}`), whose value is computed.
pub fn string_value(node: Node, src: &[u8]) -> Option<String> {
    let mut prefix = "";
    let mut body_start = None;
    let mut body_end = None;
    let mut cursor = node.walk();
    for child in node.children(&mut cursor) {
        match child.kind() {
            "string_start" => {
                prefix = child.utf8_text(src).ok()?;
                body_start = Some(child.end_byte());
            }
            "string_end" => body_end = Some(child.start_byte()),
            "interpolation" => return None,
            _ => {}
        }
    }
    let body = src.get(body_start?..body_end?)?;
    let body = std::str::from_utf8(body).ok()?;
    let flags = prefix.trim_end_matches(['\'', '"']).to_ascii_lowercase();
    let raw = flags.contains('r');
    let fstring = flags.contains('f');
    let mut text = if raw {
        body.to_string()
    } else {
        unescape(body)?
    };
    if fstring {
        text = text.replace("{{", "{").replace("}}", "}");
    }
    bounded(text).and_then(|v| match v {
        Value::Str(s) => Some(s),
        _ => None,
    })
}

fn unescape(body: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = chars.next() else {
            out.push('\\');
            break;
        };
        match e {
            '\n' => {}
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0'..='7' => {
                let mut v = e.to_digit(8)?;
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            v = v * 8 + d;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.push(char::from_u32(v)?);
            }
            'x' | 'u' | 'U' => {
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let hex: String = (0..n).filter_map(|_| chars.next()).collect();
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            // `\N{NAME}` needs Unicode's name table: the value is unknown, not harmless.
            'N' => return None,
            '\\' | '\'' | '"' => out.push(e),
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'f' => out.push('\x0c'),
            'v' => out.push('\x0b'),
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    Some(out)
}
