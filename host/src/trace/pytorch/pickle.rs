//! A small, data-only pickle decoder.
//!
//! It understands the opcodes of pickle protocols 0 to 5 that build plain data (None, bool, int,
//! float, str, bytes, list, tuple, dict, set) and refuses every opcode that would import a global,
//! call it, or build an object (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`,
//! `NEWOBJ`, `NEWOBJ_EX`, `EXT1/2/4`, `PERSID`, `BINPERSID`, `NEXT_BUFFER`). Nothing it reads is ever
//! executed.
//!
//! Why not `serde-pickle`: version 1.2 keeps `GLOBAL`/`REDUCE` results as opaque values instead of
//! refusing them, and it resolves memo references by cloning, which fails with a false
//! "recursive structure" error on real PyTorch snapshots (the frames lists are shared through the
//! memo) and would expand "billion laughs" pickles exponentially. This decoder keeps every value
//! once, in one node vector; memo references and `DUP` share the node, and so do equal small constants
//! (`None`, booleans, integers below 2^16). Memory and time are linear in the input: each opcode adds at
//! most one node.

use std::borrow::Cow;

/// Index of a node in [`Pickle::nodes`].
pub(crate) type NodeId = u32;

/// One decoded value. Strings borrow from the input where they can.
#[derive(Debug, Clone)]
pub(crate) enum Node<'a> {
    None,
    Bool(bool),
    /// Any integer up to 128 bits (addresses above 2^63 arrive as 9-byte `LONG1`).
    Int(i128),
    /// An integer that needs more than 128 bits.
    BigInt,
    Float(f64),
    /// A `str` (UTF-8 bytes, not checked) or a protocol-0/1 byte string.
    Str(Cow<'a, [u8]>),
    Bytes,
    List(Vec<NodeId>),
    Tuple(Vec<NodeId>),
    Dict(Vec<(NodeId, NodeId)>),
}

impl Node<'_> {
    /// A short name of the node's type, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Node::None => "None",
            Node::Bool(_) => "bool",
            Node::Int(_) | Node::BigInt => "int",
            Node::Float(_) => "float",
            Node::Str(_) => "str",
            Node::Bytes => "bytes",
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Dict(_) => "dict",
        }
    }
}

/// A decoded pickle: a vector of nodes and the root.
#[derive(Debug)]
pub(crate) struct Pickle<'a> {
    pub(crate) nodes: Vec<Node<'a>>,
    pub(crate) root: NodeId,
}

impl<'a> Pickle<'a> {
    pub(crate) fn node(&self, id: NodeId) -> &Node<'a> {
        &self.nodes[id as usize]
    }

    /// Looks `key` up in the dict `id` (linear scan: snapshot dicts have a dozen keys). A key set twice
    /// (`SETITEM`s of one key) has its last value, as Python's `dict` does.
    pub(crate) fn get(&self, dict: &[(NodeId, NodeId)], key: &str) -> Option<NodeId> {
        dict.iter()
            .rev()
            .find(|(k, _)| matches!(self.node(*k), Node::Str(s) if **s == *key.as_bytes()))
            .map(|(_, v)| *v)
    }
}

/// Why decoding stopped.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PickleErrorKind {
    /// The data ended before the `STOP` opcode.
    Truncated,
    /// An opcode this decoder does not know.
    UnknownOpcode(u8),
    /// An opcode that imports a global, calls it or builds an object.
    RunsCode { opcode: &'static str, global: Option<String> },
    /// Malformed data: stack underflow, missing mark, bad memo index, bad text literal...
    Malformed(String),
}

/// A decoding error at a byte offset of the input.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PickleError {
    /// Offset of the opcode at fault, in bytes from the start of the file.
    pub(crate) offset: usize,
    pub(crate) kind: PickleErrorKind,
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    op_pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, kind: PickleErrorKind) -> PickleError {
        PickleError { offset: self.op_pos, kind }
    }
    fn malformed(&self, msg: impl Into<String>) -> PickleError {
        self.err(PickleErrorKind::Malformed(msg.into()))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end =
            self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or(self.err(PickleErrorKind::Truncated))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn len32(&mut self) -> Result<usize, PickleError> {
        Ok(u32::from_le_bytes(self.le()?) as usize)
    }
    fn len64(&mut self) -> Result<usize, PickleError> {
        let n = u64::from_le_bytes(self.le()?);
        usize::try_from(n).map_err(|_| self.err(PickleErrorKind::Truncated))
    }
    /// A protocol-0 argument: the bytes up to (not including) the next `\n`.
    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or(self.err(PickleErrorKind::Truncated))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }
}

/// Little-endian two's complement (as `LONG1`/`LONG4` store it) to `Node::Int` or `Node::BigInt`.
fn long_from_le(bytes: &[u8]) -> Node<'static> {
    if bytes.is_empty() {
        return Node::Int(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0 };
    // Strip redundant sign bytes so that e.g. a 9-byte positive 64-bit address fits.
    let mut n = bytes.len();
    while n > 1 && bytes[n - 1] == fill && (bytes[n - 2] & 0x80 != 0) == negative {
        n -= 1;
    }
    if n > 16 {
        return Node::BigInt;
    }
    let mut buf = [fill; 16];
    buf[..n].copy_from_slice(&bytes[..n]);
    Node::Int(i128::from_le_bytes(buf))
}

/// The names of the opcodes that are refused, by opcode byte.
fn code_opcode(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x97 => "NEXT_BUFFER",
        _ => return None,
    })
}

/// Decodes `data` (a whole pickle, protocols 0 to 5) into a vector of plain values.
pub(crate) fn decode(data: &[u8]) -> Result<Pickle<'_>, PickleError> {
    let mut r = Reader { data, pos: 0, op_pos: 0 };
    let mut nodes: Vec<Node<'_>> = Vec::with_capacity(data.len() / 8);
    let mut stack: Vec<NodeId> = Vec::with_capacity(64);
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: Vec<Option<NodeId>> = Vec::new();
    // The last two string literals pushed, to name the global a STACK_GLOBAL would import.
    let mut last_strs: [Option<NodeId>; 2] = [None, None];

    macro_rules! push {
        ($node:expr) => {{
            let id = NodeId::try_from(nodes.len()).map_err(|_| r.malformed("too many values"))?;
            nodes.push($node);
            stack.push(id);
        }};
    }
    // `None`, the booleans and the integers below 2^16 (`BININT1`, `BININT2`: a stream, a size class, a
    // frame's line) share one node per value, made at its first use: values are never changed once made
    // (only lists and dicts grow), and a writer copies integers by value (`pickle_write`). Measured on a
    // 1,005,465-event snapshot (`decomfl` repeated 42 times): the decoder's time went into writing new
    // nodes to fresh memory (its node stores and the page faults behind them), so every node not made
    // is time saved.
    let mut shared_const: [NodeId; 3] = [NodeId::MAX; 3];
    let mut shared_u16: Vec<NodeId> = vec![NodeId::MAX; 1 << 16];
    macro_rules! push_shared {
        ($slot:expr, $node:expr) => {{
            if $slot == NodeId::MAX {
                $slot = NodeId::try_from(nodes.len()).map_err(|_| r.malformed("too many values"))?;
                nodes.push($node);
            }
            stack.push($slot);
        }};
    }
    macro_rules! pop {
        () => {{
            if marks.last() == Some(&stack.len()) {
                return Err(r.malformed("stack underflow below MARK"));
            }
            stack.pop().ok_or_else(|| r.malformed("stack underflow"))?
        }};
    }
    macro_rules! pop_mark {
        () => {{
            let m = marks.pop().ok_or_else(|| r.malformed("no MARK on the stack"))?;
            if m > stack.len() {
                return Err(r.malformed("stack underflow below MARK"));
            }
            stack.split_off(m)
        }};
    }
    // APPENDS and SETITEMS: the items above the last MARK stay on the stack until they are moved into
    // the container below them (no temporary vector per batch). `mark_start!` pops the MARK and gives
    // where its items start; `container_below!(m)` is the node under them, as `top_container!` after a
    // `pop_mark!` would give it.
    macro_rules! mark_start {
        () => {{
            let m = marks.pop().ok_or_else(|| r.malformed("no MARK on the stack"))?;
            if m > stack.len() {
                return Err(r.malformed("stack underflow below MARK"));
            }
            m
        }};
    }
    macro_rules! container_below {
        ($m:expr) => {{
            let m = $m;
            if m == 0 {
                return Err(r.malformed("stack underflow"));
            }
            if marks.last().is_some_and(|&k| k > m - 1) {
                return Err(r.malformed("stack underflow below MARK"));
            }
            stack[m - 1] as usize
        }};
    }
    macro_rules! top_container {
        () => {{
            let t = *stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
            if marks.last().is_some_and(|&m| m > stack.len() - 1) {
                return Err(r.malformed("stack underflow below MARK"));
            }
            t as usize
        }};
    }
    fn memo_put(memo: &mut Vec<Option<NodeId>>, id: u64, value: NodeId, limit: usize) -> Result<(), String> {
        let i =
            usize::try_from(id).ok().filter(|&i| i <= limit).ok_or_else(|| format!("memo index {id} out of range"))?;
        if i >= memo.len() {
            memo.resize(i + 1, None);
        }
        memo[i] = Some(value);
        Ok(())
    }
    let memo_limit = data.len();

    loop {
        r.op_pos = r.pos;
        let op = r.u8()?;
        if let Some(name) = code_opcode(op) {
            let global = match op {
                b'c' | b'i' => {
                    let module = String::from_utf8_lossy(r.line()?).into_owned();
                    let name = String::from_utf8_lossy(r.line()?).into_owned();
                    Some(format!("{module}.{name}"))
                }
                0x93 => {
                    let name = |id: Option<NodeId>| match id.map(|i| &nodes[i as usize]) {
                        Some(Node::Str(s)) => String::from_utf8_lossy(s).into_owned(),
                        _ => "?".to_string(),
                    };
                    Some(format!("{}.{}", name(last_strs[0]), name(last_strs[1])))
                }
                _ => None,
            };
            return Err(r.err(PickleErrorKind::RunsCode { opcode: name, global }));
        }
        let mut pushed_str = false;
        match op {
            0x80 => {
                let proto = r.u8()?;
                if proto > 5 {
                    return Err(r.malformed(format!("unsupported pickle protocol {proto}")));
                }
            }
            0x95 => {
                r.take(8)?;
            }
            b'.' => {
                let root = pop!();
                return Ok(Pickle { nodes, root });
            }
            b'(' => marks.push(stack.len()),
            b'0' => {
                if marks.last() == Some(&stack.len()) {
                    marks.pop();
                } else {
                    pop!();
                }
            }
            b'1' => {
                let _ = pop_mark!();
            }
            b'2' => {
                let t = *stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
                stack.push(t);
            }
            b'N' => push_shared!(shared_const[0], Node::None),
            0x88 => push_shared!(shared_const[1], Node::Bool(true)),
            0x89 => push_shared!(shared_const[2], Node::Bool(false)),
            b'J' => push!(Node::Int(i32::from_le_bytes(r.le()?).into())),
            b'K' => {
                let v = r.u8()?;
                push_shared!(shared_u16[v as usize], Node::Int(v.into()))
            }
            b'M' => {
                let v = u16::from_le_bytes(r.le()?);
                push_shared!(shared_u16[v as usize], Node::Int(v.into()))
            }
            0x8a => {
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                push!(long_from_le(b));
            }
            0x8b => {
                let n = r.len32()?;
                let b = r.take(n)?;
                push!(long_from_le(b));
            }
            b'I' | b'L' => {
                let line = r.line()?;
                let text = std::str::from_utf8(line).map_err(|_| r.malformed("integer literal is not text"))?;
                let text = text.trim_end_matches('L');
                let node = match text {
                    "01" if op == b'I' => Node::Bool(true),
                    "00" if op == b'I' => Node::Bool(false),
                    _ => match text.parse::<i128>() {
                        Ok(v) => Node::Int(v),
                        Err(_)
                            if !text.is_empty() && text.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()) =>
                        {
                            Node::BigInt
                        }
                        Err(_) => {
                            return Err(r.malformed(format!("bad integer literal {}", crate::trace::excerpt(text))))
                        }
                    },
                };
                push!(node);
            }
            b'G' => push!(Node::Float(f64::from_be_bytes(r.le()?))),
            b'F' => {
                let line = r.line()?;
                let v = std::str::from_utf8(line)
                    .ok()
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .ok_or_else(|| r.malformed("bad float literal"))?;
                push!(Node::Float(v));
            }
            0x8c | b'U' => {
                let n = r.u8()? as usize;
                push!(Node::Str(Cow::Borrowed(r.take(n)?)));
                pushed_str = true;
            }
            b'X' | b'T' => {
                let n = r.len32()?;
                push!(Node::Str(Cow::Borrowed(r.take(n)?)));
                pushed_str = true;
            }
            0x8d => {
                let n = r.len64()?;
                push!(Node::Str(Cow::Borrowed(r.take(n)?)));
                pushed_str = true;
            }
            b'V' => {
                // raw-unicode-escape: kept as is (only `\uXXXX` escapes would differ).
                push!(Node::Str(Cow::Borrowed(r.line()?)));
                pushed_str = true;
            }
            b'S' => {
                let line = r.line()?;
                let inner = match line {
                    [q @ (b'\'' | b'"'), mid @ .., e] if q == e => mid,
                    _ => return Err(r.malformed("bad string literal")),
                };
                push!(Node::Str(unescape(inner)));
                pushed_str = true;
            }
            b'C' => {
                let n = r.u8()? as usize;
                r.take(n)?;
                push!(Node::Bytes);
            }
            b'B' => {
                let n = r.len32()?;
                r.take(n)?;
                push!(Node::Bytes);
            }
            0x8e | 0x96 => {
                let n = r.len64()?;
                r.take(n)?;
                push!(Node::Bytes);
            }
            0x98 => {
                stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
            }
            b']' | 0x8f => push!(Node::List(Vec::new())),
            b')' => push!(Node::Tuple(Vec::new())),
            b'}' => push!(Node::Dict(Vec::new())),
            b'l' | 0x91 => {
                let items = pop_mark!();
                push!(Node::List(items));
            }
            b't' => {
                let items = pop_mark!();
                push!(Node::Tuple(items));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n || marks.last().is_some_and(|&m| m > stack.len() - n) {
                    return Err(r.malformed("stack underflow"));
                }
                let items = stack.split_off(stack.len() - n);
                push!(Node::Tuple(items));
            }
            b'd' => {
                let items = pop_mark!();
                if items.len() % 2 != 0 {
                    return Err(r.malformed("odd number of items for DICT"));
                }
                let pairs = items.chunks_exact(2).map(|p| (p[0], p[1])).collect();
                push!(Node::Dict(pairs));
            }
            b'a' => {
                let v = pop!();
                let t = top_container!();
                match &mut nodes[t] {
                    Node::List(l) => l.push(v),
                    other => return Err(r.malformed(format!("APPEND to a {}", other.type_name()))),
                }
            }
            b'e' | 0x90 => {
                let m = mark_start!();
                let t = container_below!(m);
                match &mut nodes[t] {
                    Node::List(l) => l.extend_from_slice(&stack[m..]),
                    other => return Err(r.malformed(format!("APPENDS to a {}", other.type_name()))),
                }
                stack.truncate(m);
            }
            b's' => {
                let v = pop!();
                let k = pop!();
                let t = top_container!();
                match &mut nodes[t] {
                    Node::Dict(d) => d.push((k, v)),
                    other => return Err(r.malformed(format!("SETITEM on a {}", other.type_name()))),
                }
            }
            b'u' => {
                let m = mark_start!();
                if (stack.len() - m) % 2 != 0 {
                    return Err(r.malformed("odd number of items for SETITEMS"));
                }
                let t = container_below!(m);
                match &mut nodes[t] {
                    Node::Dict(d) => d.extend(stack[m..].chunks_exact(2).map(|p| (p[0], p[1]))),
                    other => return Err(r.malformed(format!("SETITEMS on a {}", other.type_name()))),
                }
                stack.truncate(m);
            }
            0x94 => {
                let t = *stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
                let next = memo.len() as u64;
                memo_put(&mut memo, next, t, memo_limit).map_err(|m| r.malformed(m))?;
            }
            b'p' | b'q' | b'r' => {
                let id = match op {
                    b'p' => {
                        let line = r.line()?;
                        std::str::from_utf8(line)
                            .ok()
                            .and_then(|t| t.parse::<u64>().ok())
                            .ok_or_else(|| r.malformed("bad PUT index"))?
                    }
                    b'q' => r.u8()?.into(),
                    _ => r.len32()? as u64,
                };
                let t = *stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
                memo_put(&mut memo, id, t, memo_limit).map_err(|m| r.malformed(m))?;
            }
            b'g' | b'h' | b'j' => {
                let id = match op {
                    b'g' => {
                        let line = r.line()?;
                        std::str::from_utf8(line)
                            .ok()
                            .and_then(|t| t.parse::<u64>().ok())
                            .ok_or_else(|| r.malformed("bad GET index"))?
                    }
                    b'h' => r.u8()?.into(),
                    _ => r.len32()? as u64,
                };
                let v = usize::try_from(id)
                    .ok()
                    .and_then(|i| memo.get(i).copied().flatten())
                    .ok_or_else(|| r.malformed(format!("memo index {id} was never stored")))?;
                pushed_str = matches!(nodes[v as usize], Node::Str(_));
                stack.push(v);
            }
            other => return Err(r.err(PickleErrorKind::UnknownOpcode(other))),
        }
        if pushed_str {
            last_strs = [last_strs[1], stack.last().copied()];
        } else if !matches!(op, 0x94 | b'p' | b'q' | b'r' | 0x95 | 0x80) {
            last_strs = [None, None];
        }
    }
}

/// Undoes the escapes of a protocol-0 `STRING` literal (Python `repr` of a byte string).
fn unescape(s: &[u8]) -> Cow<'_, [u8]> {
    if !s.contains(&b'\\') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && i + 1 < s.len() {
            let (c, used) = match s[i + 1] {
                b'n' => (b'\n', 2),
                b't' => (b'\t', 2),
                b'r' => (b'\r', 2),
                b'x' if i + 3 < s.len() => {
                    match std::str::from_utf8(&s[i + 2..i + 4]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(v) => (v, 4),
                        None => (b'\\', 1),
                    }
                }
                c => (c, 2),
            };
            out.push(c);
            i += used;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_protocol4_dict_with_shared_list() {
        // pickle.dumps({'a': [1, 2**64], 'b': 'x'}, protocol=4) with the list memoised and reused.
        let data = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01e\x8c\x01b\x94h\x02u.";
        let p = decode(data).unwrap();
        let Node::Dict(d) = p.node(p.root) else { panic!() };
        let a = p.get(d, "a").unwrap();
        let b = p.get(d, "b").unwrap();
        assert_eq!(a, b, "memo reference shares the node");
        let Node::List(l) = p.node(a) else { panic!() };
        assert!(matches!(p.node(l[0]), Node::Int(1)));
        assert!(matches!(p.node(l[1]), Node::Int(v) if *v == 1i128 << 64));
    }

    #[test]
    fn a_key_set_twice_has_its_last_value() {
        // pickle of {'a': 1} followed by a second SETITEM 'a' -> 2: Python's pickle.loads gives {'a': 2}.
        let p = decode(b"\x80\x04}(\x8c\x01aK\x01\x8c\x01aK\x02u.").unwrap();
        let Node::Dict(d) = p.node(p.root) else { panic!() };
        assert!(matches!(p.node(p.get(d, "a").unwrap()), Node::Int(2)));
    }

    #[test]
    fn refuses_globals_and_names_them() {
        let e = decode(b"cos\nsystem\n(S'echo hi'\ntR.").unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::RunsCode { opcode: "GLOBAL", global: Some("os.system".into()) });
        let e = decode(b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94.").unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::RunsCode { opcode: "STACK_GLOBAL", global: Some("os.system".into()) });
    }

    #[test]
    fn long_encodings() {
        assert!(matches!(long_from_le(&[0xff]), Node::Int(-1)));
        assert!(matches!(long_from_le(&[0x00, 0x80, 0x00]), Node::Int(0x8000)));
        assert!(matches!(long_from_le(&[0x00, 0x80]), Node::Int(-0x8000)));
        assert!(matches!(long_from_le(&[0u8; 40]), Node::Int(0)));
        let mut big = [0u8; 20];
        big[18] = 1;
        assert!(matches!(long_from_le(&big), Node::BigInt));
    }

    #[test]
    fn truncation_is_reported() {
        assert_eq!(decode(b"\x80\x04]\x94(K\x01").unwrap_err().kind, PickleErrorKind::Truncated);
        assert_eq!(decode(b"").unwrap_err().kind, PickleErrorKind::Truncated);
    }
}
