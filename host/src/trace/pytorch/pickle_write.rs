//! A small pickle writer: protocol 4, plain data only, byte for byte what CPython's pickler writes.
//!
//! [`PickleWriter`] writes `None`, bools, integers, floats, strings, lists, tuples and dicts with the
//! opcodes CPython's C pickler (`Modules/_pickle.c`, the one `torch.cuda.memory._dump_snapshot` runs)
//! chooses for them under protocol 4: `BININT1`/`BININT2`/`BININT`/`LONG1` by magnitude,
//! `SHORT_BINUNICODE`/`BINUNICODE`/`BINUNICODE8` by length, `EMPTY_LIST`/`EMPTY_DICT` then items in
//! batches of 1000 (`MARK … APPENDS`/`SETITEMS`, a lone item with `APPEND`/`SETITEM`), `TUPLE1..3` or
//! `MARK … TUPLE`, every string and container memoised (`MEMOIZE`) so that a later [`PickleWriter::get`]
//! shares it, and the output cut into `FRAME`s of at least 64 KiB at value boundaries (a string of 64 KiB
//! or more goes outside frames). It writes only opcodes this crate's pickle decoder
//! understands; nothing it writes imports or calls code.
//!
//! Because the choices are CPython's, decoding a PyTorch snapshot and writing its values again through
//! `NodeCopier` gives the same bytes as the file (tested on the shipped snapshots).
//!
//! Why our own writer: `serde-pickle` 1.2 (the maintained pickle crate) writes protocols 2 and 3 only
//! and has no memo: every value is written again at each use. A PyTorch snapshot shares each stack-frame
//! list and every key string among thousands of events through the memo; re-pickled without it
//! (CPython's `Pickler.fast = True`, measured) `data/decomfl_opt_zo_federated_memory.pickle` grows from
//! 2,053,137 B to 21,142,331 B (10.3×) and the 3.26 MB training-step snapshot to 95,367,237 B (29.2×),
//! so a 10^6-event history would take 0.9 to 4.8 GB instead of about 0.1 GB. It also serialises `serde`
//! values only, while copying a snapshot's keys this crate does not model needs the decoded tree.
//!
//! Memory: the writer holds one frame (64 KiB and the last value) and streams the rest to its
//! [`Write`]; wrap a file in a `BufWriter`.

use std::io::{self, Write};

use super::pickle::{Node, NodeId, Pickle};

/// CPython's `FRAME_SIZE_TARGET`: a frame is closed at the first value boundary past 64 KiB.
const FRAME_TARGET: usize = 64 * 1024;
/// CPython's `FRAME_SIZE_MIN`: a shorter frame is written without its `FRAME` header.
const FRAME_MIN: usize = 4;
/// Items per `APPENDS`/`SETITEMS` batch (CPython's `BATCHSIZE`).
const BATCH: u64 = 1000;

/// A memo slot of a value the writer has written: [`PickleWriter::get`] writes a reference to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoRef(u32);

#[derive(Debug)]
enum Open {
    /// A list of `len` items, `done` written.
    List { len: u64, done: u64 },
    /// A dict of `len` pairs, `done` keys and values written (two per pair).
    Dict { len: u64, done: u64 },
    /// A tuple of `len` items, `done` written.
    Tuple { len: u64, done: u64 },
}

/// Writes one pickle (protocol 4) to `W`: [`new`](Self::new), then exactly one value (a container is
/// [`begin_list`](Self::begin_list)/[`begin_dict`](Self::begin_dict)/[`begin_tuple`](Self::begin_tuple),
/// its items, [`end`](Self::end)), then [`finish`](Self::finish).
///
/// Containers are announced with their length (CPython's opcodes depend on it: a one-item list is
/// written with `APPEND`); a dict's items are written key, value, key, value. Writing more or fewer items
/// than announced, a second top-level value, or `finish` with a container open is refused with an
/// [`io::ErrorKind::InvalidInput`] error (a bug in the caller, never bad input).
#[derive(Debug)]
pub struct PickleWriter<W: Write> {
    out: W,
    /// The open frame (without its header).
    frame: Vec<u8>,
    /// The next memo index.
    memo: u32,
    open: Vec<Open>,
    /// A top-level value has been written.
    root_done: bool,
    /// Bytes written to `out` so far.
    written: u64,
}

fn misuse(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("pickle writer: {what}"))
}

impl<W: Write> PickleWriter<W> {
    /// Starts a protocol-4 pickle on `out` (writes the `PROTO 4` header).
    ///
    /// # Errors
    /// The error of `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[0x80, 4])?;
        Ok(PickleWriter {
            out,
            frame: Vec::with_capacity(2 * FRAME_TARGET),
            memo: 0,
            open: Vec::new(),
            root_done: false,
            written: 2,
        })
    }

    /// Closes the open frame into `out` (CPython's `_Pickler_CommitFrame`).
    fn commit_frame(&mut self) -> io::Result<()> {
        if self.frame.is_empty() {
            return Ok(());
        }
        if self.frame.len() >= FRAME_MIN {
            self.out.write_all(&[0x95])?;
            self.out.write_all(&(self.frame.len() as u64).to_le_bytes())?;
            self.written += 9;
        }
        self.out.write_all(&self.frame)?;
        self.written += self.frame.len() as u64;
        self.frame.clear();
        Ok(())
    }

    /// Starts a value: counts it in its container (or as the root) and closes a full frame, as CPython
    /// does before saving each object.
    fn begin_value(&mut self) -> io::Result<()> {
        match self.open.last_mut() {
            None if self.root_done => return Err(misuse("a second top-level value")),
            None => self.root_done = true,
            Some(open) => {
                let (cap, done) = match open {
                    Open::Dict { len, done } => (*len * 2, done),
                    Open::List { len, done } | Open::Tuple { len, done } => (*len, done),
                };
                if *done >= cap {
                    return Err(misuse("more items than the container announced"));
                }
                *done += 1;
            }
        }
        if self.frame.len() >= FRAME_TARGET {
            self.commit_frame()?;
        }
        Ok(())
    }

    /// Ends a value: writes the batch opcodes its container needs after it.
    fn end_value(&mut self) {
        match self.open.last() {
            Some(&Open::List { len, done }) if len > 1 && done % BATCH == 0 => {
                // A full batch: APPENDS, and a MARK for the next one if items remain.
                self.frame.push(b'e');
                if done < len {
                    self.frame.push(b'(');
                }
            }
            Some(&Open::Dict { len, done }) if len > 1 && done % (2 * BATCH) == 0 => {
                // CPython's `batch_dict_exact` opens a new batch after every full one, even if it stays
                // empty (a dict of exactly 1000·k items ends with `MARK SETITEMS`).
                self.frame.extend_from_slice(b"u(");
            }
            _ => {}
        }
    }

    fn memoize(&mut self) -> io::Result<MemoRef> {
        let m = self.memo;
        self.memo =
            self.memo.checked_add(1).filter(|&n| n < u32::MAX).ok_or_else(|| misuse("memo is full (2^32 values)"))?;
        self.frame.push(0x94);
        Ok(MemoRef(m))
    }

    /// Writes `None`.
    ///
    /// # Errors
    /// The error of the output, or misuse (see the type).
    pub fn none(&mut self) -> io::Result<()> {
        self.begin_value()?;
        self.frame.push(b'N');
        self.end_value();
        Ok(())
    }

    /// Writes a bool (`NEWTRUE`/`NEWFALSE`).
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn bool(&mut self, b: bool) -> io::Result<()> {
        self.begin_value()?;
        self.frame.push(if b { 0x88 } else { 0x89 });
        self.end_value();
        Ok(())
    }

    /// Writes an integer: `BININT1` (0..=255), `BININT2` (..=65535), `BININT` (32-bit signed), else `LONG1`
    /// with the shortest little-endian two's complement.
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn int(&mut self, v: i128) -> io::Result<()> {
        self.begin_value()?;
        if (0..=0xff).contains(&v) {
            self.frame.extend_from_slice(&[b'K', v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.frame.push(b'M');
            self.frame.extend_from_slice(&(v as u16).to_le_bytes());
        } else if let Ok(small) = i32::try_from(v) {
            self.frame.push(b'J');
            self.frame.extend_from_slice(&small.to_le_bytes());
        } else {
            let bytes = v.to_le_bytes();
            let fill = if v < 0 { 0xff } else { 0 };
            let mut n = 16;
            // Drop sign bytes while the byte below keeps the sign.
            while n > 1 && bytes[n - 1] == fill && (bytes[n - 2] & 0x80 != 0) == (v < 0) {
                n -= 1;
            }
            self.frame.extend_from_slice(&[0x8a, n as u8]);
            self.frame.extend_from_slice(&bytes[..n]);
        }
        self.end_value();
        Ok(())
    }

    /// Writes a float (`BINFLOAT`, big-endian IEEE 754).
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn float(&mut self, v: f64) -> io::Result<()> {
        self.begin_value()?;
        self.frame.push(b'G');
        self.frame.extend_from_slice(&v.to_be_bytes());
        self.end_value();
        Ok(())
    }

    /// Writes a string and memoises it; the returned [`MemoRef`] writes it again by reference.
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn str(&mut self, s: &str) -> io::Result<MemoRef> {
        self.str_bytes(s.as_bytes())
    }

    /// [`str`](Self::str) of UTF-8 bytes as they were read (not checked: a string copied from a pickle
    /// is written as it came).
    pub(crate) fn str_bytes(&mut self, s: &[u8]) -> io::Result<MemoRef> {
        self.begin_value()?;
        let n = s.len();
        let mut header = Vec::with_capacity(9);
        if n < 256 {
            header.extend_from_slice(&[0x8c, n as u8]);
        } else if let Ok(n32) = u32::try_from(n) {
            header.push(b'X');
            header.extend_from_slice(&n32.to_le_bytes());
        } else {
            header.push(0x8d);
            header.extend_from_slice(&(n as u64).to_le_bytes());
        }
        if n >= FRAME_TARGET {
            // CPython's `_Pickler_write_bytes`: a large payload goes outside frames.
            self.commit_frame()?;
            self.out.write_all(&header)?;
            self.out.write_all(s)?;
            self.written += (header.len() + n) as u64;
        } else {
            self.frame.extend_from_slice(&header);
            self.frame.extend_from_slice(s);
        }
        let m = self.memoize()?;
        self.end_value();
        Ok(m)
    }

    /// Writes a reference to a memoised value (`BINGET`, or `LONG_BINGET` from index 256).
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn get(&mut self, m: MemoRef) -> io::Result<()> {
        self.begin_value()?;
        if m.0 < 256 {
            self.frame.extend_from_slice(&[b'h', m.0 as u8]);
        } else {
            self.frame.push(b'j');
            self.frame.extend_from_slice(&m.0.to_le_bytes());
        }
        self.end_value();
        Ok(())
    }

    /// Opens a list of `len` items (memoised at once, so an item may refer to the list itself).
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn begin_list(&mut self, len: usize) -> io::Result<MemoRef> {
        self.begin_value()?;
        self.frame.push(b']');
        let m = self.memoize()?;
        if len > 1 {
            self.frame.push(b'(');
        }
        self.open.push(Open::List { len: len as u64, done: 0 });
        Ok(m)
    }

    /// Opens a dict of `len` pairs (memoised at once); write key, value, key, value, ...
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn begin_dict(&mut self, len: usize) -> io::Result<MemoRef> {
        self.begin_value()?;
        self.frame.push(b'}');
        let m = self.memoize()?;
        if len > 1 {
            self.frame.push(b'(');
        }
        self.open.push(Open::Dict { len: len as u64, done: 0 });
        Ok(m)
    }

    /// Opens a tuple of `len` items (memoised when it is closed: a tuple is built from its items).
    ///
    /// # Errors
    /// As [`none`](Self::none).
    pub fn begin_tuple(&mut self, len: usize) -> io::Result<()> {
        self.begin_value()?;
        if len > 3 {
            self.frame.push(b'(');
        }
        self.open.push(Open::Tuple { len: len as u64, done: 0 });
        Ok(())
    }

    /// Closes the innermost container. Returns the tuple's memo slot (`None` for a list or dict, whose
    /// slot [`begin_list`](Self::begin_list)/[`begin_dict`](Self::begin_dict) returned, and for the empty
    /// tuple, which CPython does not memoise).
    ///
    /// # Errors
    /// Misuse: no open container, or fewer items than announced.
    pub fn end(&mut self) -> io::Result<Option<MemoRef>> {
        let open = self.open.pop().ok_or_else(|| misuse("end() with no open container"))?;
        let r = match open {
            Open::List { len, done } => {
                if done != len {
                    return Err(misuse("fewer list items than announced"));
                }
                match len {
                    0 => {}
                    1 => self.frame.push(b'a'),
                    _ if len % BATCH != 0 => self.frame.push(b'e'),
                    _ => {} // the last batch was closed after its last item
                }
                None
            }
            Open::Dict { len, done } => {
                if done != 2 * len {
                    return Err(misuse("fewer dict items than announced"));
                }
                match len {
                    0 => {}
                    1 => self.frame.push(b's'),
                    // After a full last batch the empty batch that `end_value` opened is closed here.
                    _ => self.frame.push(b'u'),
                }
                None
            }
            Open::Tuple { len, done } => {
                if done != len {
                    return Err(misuse("fewer tuple items than announced"));
                }
                match len {
                    0 => {
                        self.frame.push(b')');
                        None
                    }
                    1..=3 => {
                        self.frame.push(0x84 + len as u8);
                        Some(self.memoize()?)
                    }
                    _ => {
                        self.frame.push(b't');
                        Some(self.memoize()?)
                    }
                }
            }
        };
        self.end_value();
        Ok(r)
    }

    /// Writes `STOP`, closes the last frame and returns the output (not flushed: a `BufWriter` flushes
    /// when dropped, or call `flush` on it to see the error).
    ///
    /// # Errors
    /// Misuse: no value, or a container still open; the error of the output.
    pub fn finish(mut self) -> io::Result<W> {
        if !self.open.is_empty() || !self.root_done {
            return Err(misuse("finish() before one complete value"));
        }
        self.frame.push(b'.');
        self.commit_frame()?;
        Ok(self.out)
    }
}

/// Why a decoded value cannot be written again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CopyError {
    /// The decoder keeps no content for it (`bytes`, an integer wider than 128 bits).
    NoContent(&'static str),
    /// A tuple that contains itself (through a list or dict): CPython writes it with `POP`s, which this
    /// writer does not.
    RecursiveTuple,
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The output failed.
    Io(io::ErrorKind, String),
}

impl From<io::Error> for CopyError {
    fn from(e: io::Error) -> Self {
        CopyError::Io(e.kind(), e.to_string())
    }
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::NoContent(what) => write!(f, "it holds {what}, whose content the reader does not keep"),
            CopyError::RecursiveTuple => f.write_str("it holds a tuple that contains itself"),
            CopyError::TooDeep => write!(f, "its values are nested more than {MAX_DEPTH} deep"),
            CopyError::Io(_, m) => f.write_str(m),
        }
    }
}

/// The deepest nesting [`NodeCopier`] follows (a snapshot nests 8 deep: top, segments, segment, blocks,
/// block, frames, frame, value).
pub(crate) const MAX_DEPTH: usize = 64;

/// Writes decoded values again, sharing what the input shared: the first copy of a string or container
/// node is memoised, a later copy of the same node is a memo reference.
pub(crate) struct NodeCopier<'p, 'a> {
    pub(crate) pickle: &'p Pickle<'a>,
    /// Memo slot of each node already written (`u32::MAX`: not yet).
    memo: Vec<u32>,
    /// Tuples being written (a reference back to one is a recursive tuple).
    in_progress: Vec<bool>,
    /// Rewrites the string value of each `filename` key ([`rewrite_frame_filenames`]).
    filename_map: Option<&'p dyn Fn(&str) -> String>,
}

impl<'p, 'a> NodeCopier<'p, 'a> {
    pub(crate) fn new(pickle: &'p Pickle<'a>) -> Self {
        NodeCopier {
            pickle,
            memo: vec![u32::MAX; pickle.len()],
            in_progress: vec![false; pickle.len()],
            filename_map: None,
        }
    }

    /// The memo slot of `id` if it has been written.
    pub(crate) fn written(&self, id: NodeId) -> Option<MemoRef> {
        let m = self.memo[id as usize];
        (m != u32::MAX).then_some(MemoRef(m))
    }

    /// Records that `id` was written by hand into slot `m` (a later copy of `id` refers to it).
    pub(crate) fn set_written(&mut self, id: NodeId, m: MemoRef) {
        self.memo[id as usize] = m.0;
    }

    /// Writes node `id` (and what it holds).
    pub(crate) fn copy<W: Write>(&mut self, w: &mut PickleWriter<W>, id: NodeId) -> Result<(), CopyError> {
        self.copy_at(w, id, 0)
    }

    fn copy_at<W: Write>(&mut self, w: &mut PickleWriter<W>, id: NodeId, depth: usize) -> Result<(), CopyError> {
        if depth > MAX_DEPTH {
            return Err(CopyError::TooDeep);
        }
        if let Some(m) = self.written(id) {
            return Ok(w.get(m)?);
        }
        let p = self.pickle;
        match p.node(id) {
            Node::None => w.none()?,
            Node::Bool(b) => w.bool(b)?,
            Node::Int(v) => w.int(v)?,
            Node::BigInt => return Err(CopyError::NoContent("an integer wider than 128 bits")),
            Node::Float(f) => w.float(f)?,
            Node::Bytes => return Err(CopyError::NoContent("a bytes value")),
            Node::Str(s) => {
                let m = w.str_bytes(s)?;
                self.set_written(id, m);
            }
            Node::List(items) => {
                let m = w.begin_list(items.len())?;
                self.set_written(id, m);
                for &i in items {
                    self.copy_at(w, i, depth + 1)?;
                }
                w.end()?;
            }
            Node::Dict(pairs) => {
                let m = w.begin_dict(pairs.len())?;
                self.set_written(id, m);
                for &(k, v) in pairs {
                    self.copy_at(w, k, depth + 1)?;
                    match (self.filename_map, p.node(k), p.node(v)) {
                        (Some(map), Node::Str(b"filename"), Node::Str(s)) if self.written(v).is_none() => {
                            let m = w.str(&map(&String::from_utf8_lossy(s)))?;
                            self.set_written(v, m);
                        }
                        _ => self.copy_at(w, v, depth + 1)?,
                    }
                }
                w.end()?;
            }
            Node::Tuple(items) => {
                if self.in_progress[id as usize] {
                    return Err(CopyError::RecursiveTuple);
                }
                self.in_progress[id as usize] = true;
                w.begin_tuple(items.len())?;
                for &i in items {
                    self.copy_at(w, i, depth + 1)?;
                }
                if let Some(m) = w.end()? {
                    self.set_written(id, m);
                }
                self.in_progress[id as usize] = false;
            }
        }
        Ok(())
    }
}

/// A copy of the snapshot pickle `bytes` with each stack frame's `filename` (every string value of a
/// `filename` key) replaced by `map(filename)`, everything else as it was: for deriving inputs
/// (absolute POSIX or Windows paths from a snapshot whose paths were shortened) in tests and tools.
///
/// # Errors
/// A message naming the offset for a pickle that cannot be decoded, or the value that cannot be written
/// (a bytes value, an integer wider than 128 bits, nesting deeper than 64 levels).
#[doc(hidden)]
pub fn rewrite_frame_filenames(bytes: &[u8], map: &dyn Fn(&str) -> String) -> Result<Vec<u8>, String> {
    let p = super::pickle::decode(bytes).map_err(|e| format!("cannot decode the pickle at byte {}", e.offset))?;
    let mut c = NodeCopier::new(&p);
    c.filename_map = Some(map);
    let mut w = PickleWriter::new(Vec::new()).map_err(|e| e.to_string())?;
    c.copy(&mut w, p.root).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::pickle::decode;
    use super::*;

    /// Writes the whole decoded pickle `p` again (for a pickle CPython wrote, the bytes are the input's).
    fn copy_pickle(p: &Pickle<'_>) -> Result<Vec<u8>, CopyError> {
        let mut w = PickleWriter::new(Vec::new())?;
        NodeCopier::new(p).copy(&mut w, p.root)?;
        Ok(w.finish()?)
    }

    /// `pickle.dumps(obj, 4)` of CPython 3.11 without the 9-byte FRAME header after `PROTO` (one frame:
    /// the value is shorter than 64 KiB), for the objects named in each test.
    fn cpython(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    /// Strips the single FRAME header of a short CPython pickle.
    fn unframed(mut b: Vec<u8>) -> Vec<u8> {
        if b.len() > 11 && b[2] == 0x95 {
            b.drain(2..11);
        }
        b
    }

    #[test]
    fn scalars_match_cpython() {
        // {'a': [1, 255, 256, 65535, 65536, -1, -2**31, 2**31, 2**63, 2**64, -2**63-1], 'b': 'x'*300,
        //  'c': (0, 0), 'd': 1.5, 'e': None, 'f': True, 'g': False, 'h': '', 'i': 'é'}
        let want = cpython(&format!(
            "80047d94288c0161945d94284b014bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a0900000000\
             00000080008a090000000000000000018a09ffffffffffffff7fff658c016294582c010000{}948c0163944b004b008694\
             8c016494473ff80000000000008c0165944e8c016694888c016794898c0168948c00948c0169948c02c3a994752e",
            "78".repeat(300)
        ));
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_dict(9).unwrap();
        w.str("a").unwrap();
        let ints: [i128; 11] = [1, 255, 256, 65535, 65536, -1, -(1 << 31), 1 << 31, 1 << 63, 1 << 64, -(1 << 63) - 1];
        w.begin_list(ints.len()).unwrap();
        for v in ints {
            w.int(v).unwrap();
        }
        w.end().unwrap();
        w.str("b").unwrap();
        w.str(&"x".repeat(300)).unwrap();
        w.str("c").unwrap();
        w.begin_tuple(2).unwrap();
        w.int(0).unwrap();
        w.int(0).unwrap();
        w.end().unwrap();
        w.str("d").unwrap();
        w.float(1.5).unwrap();
        w.str("e").unwrap();
        w.none().unwrap();
        w.str("f").unwrap();
        w.bool(true).unwrap();
        w.str("g").unwrap();
        w.bool(false).unwrap();
        w.str("h").unwrap();
        w.str("").unwrap();
        w.str("i").unwrap();
        w.str("é").unwrap();
        w.end().unwrap();
        assert_eq!(unframed(w.finish().unwrap()), want);
    }

    #[test]
    fn memo_references_match_cpython() {
        // s = ['k'] * 3; {'l': s, 'm': s, 'n': [s[0]]}
        let want = cpython("80047d94288c016c945d94288c016b9468036803658c016d9468028c016e945d94680361752e");
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_dict(3).unwrap();
        w.str("l").unwrap();
        let s = w.begin_list(3).unwrap();
        let k = w.str("k").unwrap();
        w.get(k).unwrap();
        w.get(k).unwrap();
        w.end().unwrap();
        w.str("m").unwrap();
        w.get(s).unwrap();
        w.str("n").unwrap();
        w.begin_list(1).unwrap();
        w.get(k).unwrap();
        w.end().unwrap();
        w.end().unwrap();
        assert_eq!(unframed(w.finish().unwrap()), want);
    }

    #[test]
    fn batches_and_frames_match_cpython_structure() {
        // A list of 2500 ints (three batches), a dict of 1000 pairs (one full batch and CPython's empty
        // one), more than 64 KiB of items (several frames), and a 70,000-byte string outside frames:
        // decoded back, every value is where it was written.
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_list(4).unwrap();
        w.begin_list(2500).unwrap();
        for i in 0..2500 {
            w.int(i * 1_000_003).unwrap();
        }
        w.end().unwrap();
        w.begin_dict(1000).unwrap();
        for i in 0..1000 {
            w.str(&format!("k{i}")).unwrap();
            w.int(i).unwrap();
        }
        w.end().unwrap();
        w.str(&"y".repeat(70_000)).unwrap();
        w.begin_tuple(5).unwrap();
        for i in 0..5 {
            w.int(i).unwrap();
        }
        w.end().unwrap();
        w.end().unwrap();
        let bytes = w.finish().unwrap();
        assert!(bytes.windows(1).filter(|b| b[0] == 0x95).count() >= 2, "framed");
        let p = decode(&bytes).unwrap();
        let Node::List(top) = p.node(p.root) else { panic!() };
        let Node::List(ints) = p.node(top[0]) else { panic!() };
        assert_eq!(ints.len(), 2500);
        assert!(ints.iter().enumerate().all(|(i, &n)| matches!(p.node(n), Node::Int(v) if v == i as i128 * 1_000_003)));
        let Node::Dict(d) = p.node(top[1]) else { panic!() };
        assert_eq!(d.len(), 1000);
        assert!(matches!(p.node(p.get(d, "k999").unwrap()), Node::Int(999)));
        assert!(matches!(p.node(top[2]), Node::Str(s) if s.len() == 70_000));
        assert!(matches!(p.node(top[3]), Node::Tuple(t) if t.len() == 5));
        // The bytes decode identically when copied again, and the copy is byte-identical.
        assert_eq!(copy_pickle(&p).unwrap(), bytes);
    }

    #[test]
    fn dict_of_exactly_one_batch_ends_with_cpythons_empty_batch() {
        // CPython 3.11: pickle.dumps({i: i for i in range(1000)}, 4) ends with b'(u.': MARK SETITEMS STOP.
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_dict(1000).unwrap();
        for i in 0..1000 {
            w.int(i).unwrap();
            w.int(i).unwrap();
        }
        w.end().unwrap();
        let b = w.finish().unwrap();
        assert!(b.ends_with(b"u(u."), "{:?}", &b[b.len() - 4..]);
    }

    #[test]
    fn recursive_list_round_trips() {
        // l = []; l.append(l): CPython writes a 6-byte frame `] MEMOIZE h\x00 a .`
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        let l = w.begin_list(1).unwrap();
        w.get(l).unwrap();
        w.end().unwrap();
        let b = w.finish().unwrap();
        assert_eq!(b, b"\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00]\x94h\x00a.");
        let p = decode(&b).unwrap();
        assert_eq!(copy_pickle(&p).unwrap(), b);
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_list(1).unwrap();
        assert!(w.end().is_err(), "fewer items");
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_list(0).unwrap();
        assert!(w.int(1).is_err(), "more items");
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.none().unwrap();
        assert!(w.none().is_err(), "two roots");
        let w = PickleWriter::new(Vec::new()).unwrap();
        assert!(w.finish().is_err(), "no root");
    }

    #[test]
    fn uncopyable_values_are_named() {
        // b'ab' (SHORT_BINBYTES) cannot be copied: the decoder keeps no bytes content.
        let p = decode(b"\x80\x04C\x02ab\x94.").unwrap();
        assert_eq!(copy_pickle(&p).unwrap_err(), CopyError::NoContent("a bytes value"));
        // 1000 nested lists.
        let mut deep = b"\x80\x04".to_vec();
        deep.extend(std::iter::repeat_n(b']', 1000));
        deep.extend(std::iter::repeat_n(b'a', 999));
        deep.push(b'.');
        let p = decode(&deep).unwrap();
        assert_eq!(copy_pickle(&p).unwrap_err(), CopyError::TooDeep);
    }

    #[test]
    fn shipped_snapshots_are_written_byte_for_byte() {
        // Every shipped snapshot was written by CPython's pickler (PyTorch's `_dump_snapshot`): decoded and
        // written again, the bytes are the file's, FRAMEs included.
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
        let mut n = 0;
        for e in std::fs::read_dir(&data).unwrap().flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "pickle") {
                let bytes = std::fs::read(&path).unwrap();
                let p = decode(&bytes).unwrap();
                let again = copy_pickle(&p).unwrap();
                assert!(again == bytes, "{}: {} B written, {} B read", path.display(), again.len(), bytes.len());
                n += 1;
            }
        }
        assert!(n >= 3, "the shipped snapshots are in data/");
    }
}
