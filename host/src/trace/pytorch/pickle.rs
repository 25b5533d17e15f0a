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
//! once, as a 12-byte slot in one vector with the items of containers in shared arrays ([`Pickle`]);
//! memo references and `DUP` share the node, and so do equal small constants (`None`, booleans, integers
//! below 2^16). Memory and time are linear in the input: each opcode adds at most one node.

use std::borrow::Cow;

/// Index of a node of a [`Pickle`].
pub(crate) type NodeId = u32;

/// One decoded value, as [`Pickle::node`] gives it: strings borrow from the input where they can, and
/// the items of lists, tuples and dicts from the pickle's item arrays.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Node<'p> {
    None,
    Bool(bool),
    /// Any integer up to 128 bits (addresses above 2^63 arrive as 9-byte `LONG1`).
    Int(i128),
    /// An integer that needs more than 128 bits.
    BigInt,
    Float(f64),
    /// A `str` (UTF-8 bytes, not checked) or a protocol-0/1 byte string.
    Str(&'p [u8]),
    Bytes,
    List(&'p [NodeId]),
    Tuple(&'p [NodeId]),
    Dict(&'p [(NodeId, NodeId)]),
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

/// How a node is stored: 12 bytes, a kind and two words whose meaning the kind gives.
///
/// Measured on a 1,005,465-event snapshot (67 MB of pickle, `decomfl` repeated 42 times): with one
/// 32-byte enum per node and a heap vector per list and dict (a million dicts), reading spent most of its
/// time writing fresh memory (the kernel's page clearing behind it) and in `malloc`. Here the items of
/// every list, tuple and dict built in one run sit in two shared arrays (`items`, `pairs`); a container
/// that grows again after other containers were built there (the long list of trace entries, built in
/// batches of 1,000 between its entries' own items) moves once into a vector of its own.
#[derive(Debug, Clone, Copy)]
struct Slot {
    kind: Kind,
    a: u32,
    b: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    None,
    True,
    False,
    /// An integer of 64 bits: `a` the low word, `b` the high word.
    Int,
    /// An integer of 65 to 128 bits: `wides[a]`.
    Wide,
    BigInt,
    /// `a` the low word, `b` the high word of the bits.
    Float,
    /// `strs[a]`.
    Str,
    Bytes,
    /// `items[a..a + b]`.
    List,
    /// `lists[a]`.
    OwnList,
    /// `items[a..a + b]`.
    Tuple,
    /// `pairs[a..a + b]`.
    Dict,
    /// `dicts[a]`.
    OwnDict,
}

impl Slot {
    const fn of(kind: Kind) -> Slot {
        Slot { kind, a: 0, b: 0 }
    }
    fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::None => "None",
            Kind::True | Kind::False => "bool",
            Kind::Int | Kind::Wide | Kind::BigInt => "int",
            Kind::Float => "float",
            Kind::Str => "str",
            Kind::Bytes => "bytes",
            Kind::List | Kind::OwnList => "list",
            Kind::Tuple => "tuple",
            Kind::Dict | Kind::OwnDict => "dict",
        }
    }
}

/// A decoded pickle: its nodes and the root. Memory and time are linear in the input (each opcode adds
/// at most one node and each item is stored once, plus at most one move of a growing container).
#[derive(Debug)]
pub(crate) struct Pickle<'a> {
    slots: Vec<Slot>,
    strs: Vec<Cow<'a, [u8]>>,
    wides: Vec<i128>,
    items: Vec<NodeId>,
    pairs: Vec<(NodeId, NodeId)>,
    lists: Vec<Vec<NodeId>>,
    dicts: Vec<Vec<(NodeId, NodeId)>>,
    /// Bytes of the items in `lists` and `dicts` (counted against the decoder's ceiling).
    owned_bytes: usize,
    pub(crate) root: NodeId,
}

impl<'a> Pickle<'a> {
    /// The number of nodes (ids `0..len`).
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Node `id` (an id this pickle gave).
    #[inline]
    pub(crate) fn node(&self, id: NodeId) -> Node<'_> {
        let s = self.slots[id as usize];
        let (a, b) = (s.a as usize, s.b as usize);
        match s.kind {
            Kind::None => Node::None,
            Kind::True => Node::Bool(true),
            Kind::False => Node::Bool(false),
            Kind::Int => Node::Int(i128::from((u64::from(s.b) << 32 | u64::from(s.a)) as i64)),
            Kind::Wide => Node::Int(self.wides[a]),
            Kind::BigInt => Node::BigInt,
            Kind::Float => Node::Float(f64::from_bits(u64::from(s.b) << 32 | u64::from(s.a))),
            Kind::Str => Node::Str(&self.strs[a]),
            Kind::Bytes => Node::Bytes,
            Kind::List => Node::List(&self.items[a..a + b]),
            Kind::OwnList => Node::List(&self.lists[a]),
            Kind::Tuple => Node::Tuple(&self.items[a..a + b]),
            Kind::Dict => Node::Dict(&self.pairs[a..a + b]),
            Kind::OwnDict => Node::Dict(&self.dicts[a]),
        }
    }

    /// Looks `key` up in the dict `id` (linear scan: snapshot dicts have a dozen keys). A key set twice
    /// (`SETITEM`s of one key) has its last value, as Python's `dict` does.
    #[inline]
    pub(crate) fn get(&self, dict: &[(NodeId, NodeId)], key: &str) -> Option<NodeId> {
        dict.iter().rev().find(|(k, _)| matches!(self.node(*k), Node::Str(s) if s == key.as_bytes())).map(|(_, v)| *v)
    }

    /// A slot for an integer.
    fn int_slot(&mut self, v: i128) -> Result<Slot, ()> {
        Ok(match i64::try_from(v) {
            Ok(v) => Slot { kind: Kind::Int, a: v as u64 as u32, b: ((v as u64) >> 32) as u32 },
            Err(_) => {
                let a = u32::try_from(self.wides.len()).map_err(|_| ())?;
                self.wides.push(v);
                Slot { kind: Kind::Wide, a, b: 0 }
            }
        })
    }

    fn str_slot(&mut self, s: Cow<'a, [u8]>) -> Result<Slot, ()> {
        let a = u32::try_from(self.strs.len()).map_err(|_| ())?;
        self.strs.push(s);
        Ok(Slot { kind: Kind::Str, a, b: 0 })
    }

    /// A list or tuple of `new` in the item array.
    fn seq_slot(&mut self, kind: Kind, new: &[NodeId]) -> Result<Slot, ()> {
        let a = u32::try_from(self.items.len()).map_err(|_| ())?;
        let b = u32::try_from(new.len()).map_err(|_| ())?;
        u32::try_from(self.items.len() + new.len()).map_err(|_| ())?;
        self.items.extend_from_slice(new);
        Ok(Slot { kind, a, b })
    }

    /// A dict of the key/value pairs `flat` (keys at even positions) in the pair array.
    fn dict_slot(&mut self, flat: &[NodeId]) -> Result<Slot, ()> {
        let a = u32::try_from(self.pairs.len()).map_err(|_| ())?;
        let b = u32::try_from(flat.len() / 2).map_err(|_| ())?;
        u32::try_from(self.pairs.len() + flat.len() / 2).map_err(|_| ())?;
        self.pairs.extend(flat.chunks_exact(2).map(|p| (p[0], p[1])));
        Ok(Slot { kind: Kind::Dict, a, b })
    }

    /// Appends `new` to list `id`: in place while the list is the last run of the item array (or empty),
    /// else after moving it into a vector of its own (once). `Err(type name)` when `id` is no list.
    fn append(&mut self, id: usize, new: &[NodeId]) -> Result<(), &'static str> {
        let s = self.slots[id];
        if !matches!(s.kind, Kind::List | Kind::OwnList) {
            return Err(s.type_name());
        }
        let slot = grow(&mut self.items, &mut self.lists, s, Kind::List, Kind::OwnList, new.iter().copied());
        self.count_owned(s, slot, new.len(), size_of::<NodeId>());
        self.slots[id] = slot;
        Ok(())
    }

    /// Sets the key/value pairs `flat` (keys at even positions) in dict `id`, as [`Pickle::append`] does
    /// for lists. `Err(type name)` when `id` is no dict.
    fn set_items(&mut self, id: usize, flat: &[NodeId]) -> Result<(), &'static str> {
        let s = self.slots[id];
        if !matches!(s.kind, Kind::Dict | Kind::OwnDict) {
            return Err(s.type_name());
        }
        let new = flat.chunks_exact(2).map(|p| (p[0], p[1]));
        let slot = grow(&mut self.pairs, &mut self.dicts, s, Kind::Dict, Kind::OwnDict, new);
        self.count_owned(s, slot, flat.len() / 2, size_of::<(NodeId, NodeId)>());
        self.slots[id] = slot;
        Ok(())
    }

    /// Counts the items a container `before` -> `after` holds in a vector of its own: `added` new ones,
    /// and its earlier ones when it moved there just now.
    fn count_owned(&mut self, before: Slot, after: Slot, added: usize, item: usize) {
        let own = |k: Kind| matches!(k, Kind::OwnList | Kind::OwnDict);
        if own(after.kind) {
            let moved = if own(before.kind) { 0 } else { before.b as usize };
            self.owned_bytes += (added + moved) * item;
        }
    }
}

/// The slot of container `s` (kind `run`: `arena[a..a + b]`, or `own`: `owned[a]`) with `new` appended: in
/// place while its run is the last of `arena` (or empty), else moved once into a vector of `owned`.
fn grow<T: Copy>(
    arena: &mut Vec<T>,
    owned: &mut Vec<Vec<T>>,
    s: Slot,
    run: Kind,
    own: Kind,
    new: impl ExactSizeIterator<Item = T>,
) -> Slot {
    let (a, b) = (s.a as usize, s.b as usize);
    if s.kind == own {
        owned[a].extend(new);
        return s;
    }
    let n = new.len();
    let last = b == 0 || a + b == arena.len();
    // Arena indices and lengths are u32; a container that would pass that moves to its own vector.
    if last && u32::try_from(arena.len() + n).is_ok() {
        let start = if b == 0 { arena.len() } else { a };
        arena.extend(new);
        return Slot { kind: run, a: start as u32, b: (b + n) as u32 };
    }
    let mut vec = Vec::with_capacity((b + n).max(2 * b));
    vec.extend_from_slice(&arena[a..a + b]);
    vec.extend(new);
    // Each owned vector belongs to a distinct slot, and there are at most 2^32 slots (ids are u32).
    let at = owned.len() as u32;
    owned.push(vec);
    Slot { kind: own, a: at, b: 0 }
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
    /// The values decoded so far (nodes, items, stack, marks, memo) need more memory than the ceiling
    /// allows: the limit, its value and how it is derived.
    Limit(String),
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

/// Little-endian two's complement (as `LONG1`/`LONG4` store it) to its value; `None` for a value that
/// needs more than 128 bits.
fn long_from_le(bytes: &[u8]) -> Option<i128> {
    if bytes.is_empty() {
        return Some(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0 };
    // Strip redundant sign bytes so that e.g. a 9-byte positive 64-bit address fits.
    let mut n = bytes.len();
    while n > 1 && bytes[n - 1] == fill && (bytes[n - 2] & 0x80 != 0) == negative {
        n -= 1;
    }
    if n > 16 {
        return None;
    }
    let mut buf = [fill; 16];
    buf[..n].copy_from_slice(&bytes[..n]);
    Some(i128::from_le_bytes(buf))
}

/// The slot of a float.
fn float_slot(v: f64) -> Slot {
    let bits = v.to_bits();
    Slot { kind: Kind::Float, a: bits as u32, b: (bits >> 32) as u32 }
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

/// Decodes `data` (a whole pickle, protocols 0 to 5) into a vector of plain values, under the memory
/// ceiling of [`crate::trace::limits::max_memory`] ([`decode_within`]).
pub(crate) fn decode(data: &[u8]) -> Result<Pickle<'_>, PickleError> {
    decode_within(data, crate::trace::limits::max_memory())
}

/// How many opcodes pass between two checks of the decoder's memory against its ceiling: each opcode
/// adds at most a few dozen bytes, so the check (a handful of multiplications) costs nothing measurable
/// and the ceiling is passed by at most a few hundred KB.
const CHECK_EVERY: u32 = 4096;

/// Decodes `data` as [`decode`] does, stopping with [`PickleErrorKind::Limit`] at the opcode where the
/// input's bytes plus what the decoder holds (nodes, item and pair arrays, strings it unescaped, the
/// stack, the marks, the memo) pass `max_memory` bytes. Every opcode adds at most one node, and each
/// stack entry is moved into a container at most once, so memory and time are linear in the input; the
/// ceiling bounds the constant.
pub(crate) fn decode_within(data: &[u8], max_memory: u64) -> Result<Pickle<'_>, PickleError> {
    use crate::trace::pages::reserve_huge as huge;
    let mut r = Reader { data, pos: 0, op_pos: 0 };
    let mut p = Pickle {
        // Room for more than a snapshot needs (`decomfl` repeated 5 times: a dict pair per 10 bytes of
        // pickle, a list item per 29), reserved but written only as far as the pickle fills it.
        slots: huge(data.len() / 8),
        strs: Vec::new(),
        wides: Vec::new(),
        items: huge(data.len() / 8),
        pairs: huge(data.len() / 4),
        lists: Vec::new(),
        dicts: Vec::new(),
        owned_bytes: 0,
        root: 0,
    };
    let mut stack: Vec<NodeId> = Vec::with_capacity(64);
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: Vec<Option<NodeId>> = Vec::new();

    macro_rules! push {
        ($slot:expr) => {{
            let slot = $slot;
            let id = NodeId::try_from(p.slots.len()).map_err(|_| r.malformed("too many values"))?;
            p.slots.push(slot);
            stack.push(id);
        }};
    }
    // A slot an arena index must fit: `Err(())` when the pickle has more than 2^32 values of a kind.
    macro_rules! fits {
        ($slot:expr) => {
            $slot.map_err(|()| r.malformed("too many values"))?
        };
    }
    // `None`, the booleans and the integers below 2^16 (`BININT1`, `BININT2`: a stream, a size class, a
    // frame's line) share one node per value, made at its first use: values are never changed once made
    // (only lists and dicts grow), and a writer copies integers by value (`pickle_write`): every node not
    // made is memory not written (see [`Slot`]).
    let mut shared_const: [NodeId; 3] = [NodeId::MAX; 3];
    let mut shared_u16: Vec<NodeId> = vec![NodeId::MAX; 1 << 16];
    macro_rules! push_shared {
        ($slot:expr, $node:expr) => {{
            if $slot == NodeId::MAX {
                let slot = $node;
                $slot = NodeId::try_from(p.slots.len()).map_err(|_| r.malformed("too many values"))?;
                p.slots.push(slot);
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
    // APPENDS and SETITEMS: the items above the last MARK stay on the stack until they are moved into
    // the container below them (no temporary vector per batch). `mark_start!` pops the MARK and gives
    // where its items start; `container_below!(m)` is the node under them, as `top_container!` would give it
    // once they were gone.
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
    let mut until_check = CHECK_EVERY;
    let mut unescaped: usize = 0;

    loop {
        r.op_pos = r.pos;
        until_check -= 1;
        if until_check == 0 {
            until_check = CHECK_EVERY;
            let held = data.len()
                + p.slots.len() * size_of::<Slot>()
                + p.items.len() * size_of::<NodeId>()
                + p.pairs.len() * size_of::<(NodeId, NodeId)>()
                + p.strs.len() * size_of::<Cow<'_, [u8]>>()
                + unescaped
                + p.wides.len() * size_of::<i128>()
                + p.owned_bytes
                + stack.len() * size_of::<NodeId>()
                + marks.len() * size_of::<usize>()
                + memo.len() * size_of::<Option<NodeId>>();
            if held as u64 > max_memory {
                return Err(r.err(PickleErrorKind::Limit(format!(
                    "memory: the decoded values need more than {max_memory} B with the input (the ceiling, \
                     --max-memory); nodes {}, stack {}, marks (nesting) {}, memo {}",
                    p.slots.len(),
                    stack.len(),
                    marks.len(),
                    memo.len()
                ))));
            }
        }
        let op = r.u8()?;
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
                p.root = pop!();
                return Ok(p);
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
                let m = mark_start!();
                stack.truncate(m);
            }
            b'2' => {
                let t = *stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
                stack.push(t);
            }
            b'N' => push_shared!(shared_const[0], Slot::of(Kind::None)),
            0x88 => push_shared!(shared_const[1], Slot::of(Kind::True)),
            0x89 => push_shared!(shared_const[2], Slot::of(Kind::False)),
            b'J' => push!(fits!(p.int_slot(i32::from_le_bytes(r.le()?).into()))),
            b'K' => {
                let v = r.u8()?;
                push_shared!(shared_u16[v as usize], fits!(p.int_slot(v.into())))
            }
            b'M' => {
                let v = u16::from_le_bytes(r.le()?);
                push_shared!(shared_u16[v as usize], fits!(p.int_slot(v.into())))
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a { r.u8()? as usize } else { r.len32()? };
                let b = r.take(n)?;
                match long_from_le(b) {
                    Some(v) => push!(fits!(p.int_slot(v))),
                    None => push!(Slot::of(Kind::BigInt)),
                }
            }
            b'I' | b'L' => {
                let line = r.line()?;
                let text = std::str::from_utf8(line).map_err(|_| r.malformed("integer literal is not text"))?;
                let text = text.trim_end_matches('L');
                let slot = match text {
                    "01" if op == b'I' => Slot::of(Kind::True),
                    "00" if op == b'I' => Slot::of(Kind::False),
                    _ => match text.parse::<i128>() {
                        Ok(v) => fits!(p.int_slot(v)),
                        Err(_)
                            if !text.is_empty() && text.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()) =>
                        {
                            Slot::of(Kind::BigInt)
                        }
                        Err(_) => {
                            return Err(r.malformed(format!("bad integer literal {}", crate::trace::excerpt(text))))
                        }
                    },
                };
                push!(slot);
            }
            b'G' => push!(float_slot(f64::from_be_bytes(r.le()?))),
            b'F' => {
                let line = r.line()?;
                let v = std::str::from_utf8(line)
                    .ok()
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .ok_or_else(|| r.malformed("bad float literal"))?;
                push!(float_slot(v));
            }
            0x8c | b'U' => {
                let n = r.u8()? as usize;
                push!(fits!(p.str_slot(Cow::Borrowed(r.take(n)?))));
            }
            b'X' | b'T' => {
                let n = r.len32()?;
                push!(fits!(p.str_slot(Cow::Borrowed(r.take(n)?))));
            }
            0x8d => {
                let n = r.len64()?;
                push!(fits!(p.str_slot(Cow::Borrowed(r.take(n)?))));
            }
            b'V' => {
                // raw-unicode-escape: kept as is (only `\uXXXX` escapes would differ).
                push!(fits!(p.str_slot(Cow::Borrowed(r.line()?))));
            }
            b'S' => {
                let line = r.line()?;
                let inner = match line {
                    [q @ (b'\'' | b'"'), mid @ .., e] if q == e => mid,
                    _ => return Err(r.malformed("bad string literal")),
                };
                let s = unescape(inner);
                if let Cow::Owned(v) = &s {
                    unescaped += v.len();
                }
                push!(fits!(p.str_slot(s)));
            }
            b'C' => {
                let n = r.u8()? as usize;
                r.take(n)?;
                push!(Slot::of(Kind::Bytes));
            }
            b'B' => {
                let n = r.len32()?;
                r.take(n)?;
                push!(Slot::of(Kind::Bytes));
            }
            0x8e | 0x96 => {
                let n = r.len64()?;
                r.take(n)?;
                push!(Slot::of(Kind::Bytes));
            }
            0x98 => {
                stack.last().ok_or_else(|| r.malformed("stack underflow"))?;
            }
            b']' | 0x8f => push!(Slot::of(Kind::List)),
            b')' => push!(Slot::of(Kind::Tuple)),
            b'}' => push!(Slot::of(Kind::Dict)),
            b'l' | 0x91 | b't' => {
                let m = mark_start!();
                let kind = if op == b't' { Kind::Tuple } else { Kind::List };
                let slot = fits!(p.seq_slot(kind, &stack[m..]));
                stack.truncate(m);
                push!(slot);
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n || marks.last().is_some_and(|&m| m > stack.len() - n) {
                    return Err(r.malformed("stack underflow"));
                }
                let m = stack.len() - n;
                let slot = fits!(p.seq_slot(Kind::Tuple, &stack[m..]));
                stack.truncate(m);
                push!(slot);
            }
            b'd' => {
                let m = mark_start!();
                if !(stack.len() - m).is_multiple_of(2) {
                    return Err(r.malformed("odd number of items for DICT"));
                }
                let slot = fits!(p.dict_slot(&stack[m..]));
                stack.truncate(m);
                push!(slot);
            }
            b'a' => {
                let v = pop!();
                let t = top_container!();
                p.append(t, &[v]).map_err(|other| r.malformed(format!("APPEND to a {other}")))?;
            }
            b'e' | 0x90 => {
                let m = mark_start!();
                let t = container_below!(m);
                p.append(t, &stack[m..]).map_err(|other| r.malformed(format!("APPENDS to a {other}")))?;
                stack.truncate(m);
            }
            b's' => {
                let v = pop!();
                let k = pop!();
                let t = top_container!();
                p.set_items(t, &[k, v]).map_err(|other| r.malformed(format!("SETITEM on a {other}")))?;
            }
            b'u' => {
                let m = mark_start!();
                if !(stack.len() - m).is_multiple_of(2) {
                    return Err(r.malformed("odd number of items for SETITEMS"));
                }
                let t = container_below!(m);
                p.set_items(t, &stack[m..]).map_err(|other| r.malformed(format!("SETITEMS on a {other}")))?;
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
                stack.push(v);
            }
            other => {
                let Some(name) = code_opcode(other) else {
                    return Err(r.err(PickleErrorKind::UnknownOpcode(other)));
                };
                let global = match op {
                    b'c' | b'i' => {
                        let module = String::from_utf8_lossy(r.line()?).into_owned();
                        let name = String::from_utf8_lossy(r.line()?).into_owned();
                        Some(format!("{module}.{name}"))
                    }
                    // STACK_GLOBAL imports the module and name on top of the stack.
                    0x93 => {
                        let name = |from_top: usize| match stack.len().checked_sub(from_top).map(|i| p.node(stack[i])) {
                            Some(Node::Str(s)) => String::from_utf8_lossy(s).into_owned(),
                            _ => "?".to_string(),
                        };
                        Some(format!("{}.{}", name(2), name(1)))
                    }
                    _ => None,
                };
                return Err(r.err(PickleErrorKind::RunsCode { opcode: name, global }));
            }
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
        assert!(matches!(p.node(l[1]), Node::Int(v) if v == 1i128 << 64));
    }

    /// A list that grows again after other containers were built in the shared item array (the trace
    /// entries' list, built in batches of 1,000 around its entries' own lists) moves into a vector of its
    /// own and keeps every item in order; a dict does the same; a list holding itself (through the memo)
    /// is decoded.
    #[test]
    fn containers_that_grow_in_batches_keep_their_items() {
        // pickle.dumps({'l': [[1], [2], [3]], 'd': {...}}) written by hand: list L = [] MEMO, MARK
        // [] (K1 APPEND) APPENDS, MARK [] (K2) [] (K3) APPENDS, then L APPEND L (itself).
        let data = b"\x80\x04]\x94(]K\x01ae(]K\x02a]K\x03aeh\x00a.";
        let p = decode(data).unwrap();
        let Node::List(l) = p.node(p.root) else { panic!() };
        assert_eq!(l.len(), 4);
        let inner = |i: usize| match p.node(l[i]) {
            Node::List(x) => x.iter().map(|&v| if let Node::Int(v) = p.node(v) { v } else { -1 }).collect::<Vec<_>>(),
            _ => panic!(),
        };
        assert_eq!([inner(0), inner(1), inner(2)], [vec![1], vec![2], vec![3]]);
        assert_eq!(l[3], p.root, "the list holds itself");
        // A dict set in two batches around another dict's items: {} MARK k1 {} (MARK k v SETITEMS)
        // SETITEMS, MARK k2 v2 SETITEMS.
        let data = b"\x80\x04}\x94(\x8c\x01a}(\x8c\x01xK\x07uu(\x8c\x01bK\x08u.";
        let p = decode(data).unwrap();
        let Node::Dict(d) = p.node(p.root) else { panic!() };
        assert_eq!(d.len(), 2);
        let Node::Dict(a) = p.node(p.get(d, "a").unwrap()) else { panic!() };
        assert!(matches!(p.node(p.get(a, "x").unwrap()), Node::Int(7)));
        assert!(matches!(p.node(p.get(d, "b").unwrap()), Node::Int(8)));
        assert!(decode(b"\x80\x04K\x01K\x02a.").is_err(), "APPEND to an int is refused");
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
        assert_eq!(long_from_le(&[0xff]), Some(-1));
        assert_eq!(long_from_le(&[0x00, 0x80, 0x00]), Some(0x8000));
        assert_eq!(long_from_le(&[0x00, 0x80]), Some(-0x8000));
        assert_eq!(long_from_le(&[0u8; 40]), Some(0));
        let mut big = [0u8; 20];
        big[18] = 1;
        assert_eq!(long_from_le(&big), None);
        // Integers of 64 to 128 bits keep their value through the wide table, negative ones too.
        let p = decode(b"\x80\x04]\x94(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xffe.").unwrap();
        let Node::List(l) = p.node(p.root) else { panic!() };
        let ints: Vec<i128> = l.iter().map(|&i| if let Node::Int(v) = p.node(i) { v } else { panic!() }).collect();
        assert_eq!(ints, [1i128 << 63, i128::from(i64::MIN), -(1i128 << 64)]);
    }

    #[test]
    fn truncation_is_reported() {
        assert_eq!(decode(b"\x80\x04]\x94(K\x01").unwrap_err().kind, PickleErrorKind::Truncated);
        assert_eq!(decode(b"").unwrap_err().kind, PickleErrorKind::Truncated);
    }
}
