//! A minimal pickle writer (protocol 4 opcodes) for hand-made PyTorch snapshots in tests.
#![allow(dead_code)]

/// A pickled value.
pub enum V<'a> {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(&'a str),
    List(Vec<V<'a>>),
    /// A tuple (PyTorch pickles a pool id `(int, int)` as one).
    Tuple(Vec<V<'a>>),
    Dict(Vec<(&'a str, V<'a>)>),
}

pub fn emit(v: &V, out: &mut Vec<u8>) {
    match v {
        V::Int(i) => {
            if let Ok(small) = i32::try_from(*i) {
                out.push(b'J');
                out.extend_from_slice(&small.to_le_bytes());
            } else {
                // LONG1: little-endian two's complement, 16 bytes then trimmed to 9.. as needed.
                let bytes = i.to_le_bytes();
                let mut n = 16;
                while n > 1
                    && ((bytes[n - 1] == 0 && bytes[n - 2] & 0x80 == 0)
                        || (bytes[n - 1] == 0xff && bytes[n - 2] & 0x80 != 0))
                {
                    n -= 1;
                }
                out.push(0x8a);
                out.push(n as u8);
                out.extend_from_slice(&bytes[..n]);
            }
        }
        V::Float(f) => {
            out.push(b'G');
            out.extend_from_slice(&f.to_be_bytes());
        }
        V::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
        V::Str(s) => {
            out.push(b'X');
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        V::List(items) => {
            out.extend_from_slice(b"](");
            items.iter().for_each(|i| emit(i, out));
            out.push(b'e');
        }
        V::Tuple(items) => {
            // MARK items TUPLE.
            out.push(b'(');
            items.iter().for_each(|i| emit(i, out));
            out.push(b't');
        }
        V::Dict(items) => {
            out.extend_from_slice(b"}(");
            for (k, v) in items {
                emit(&V::Str(k), out);
                emit(v, out);
            }
            out.push(b'u');
        }
    }
}

/// The protocol-4 pickle of `v`.
pub fn pickle(v: &V) -> Vec<u8> {
    let mut out = vec![0x80, 4];
    emit(v, &mut out);
    out.push(b'.');
    out
}

/// A `device_traces` event.
pub fn ev<'a>(action: &'a str, addr: i128, size: V<'a>) -> V<'a> {
    V::Dict(vec![("action", V::Str(action)), ("addr", V::Int(addr)), ("size", size), ("stream", V::Int(0))])
}

/// A block of a segment's `blocks` (`state`: `active_allocated`, `inactive`, ...).
/// The three integers share one type (`u64` or `i128`), so a literal takes the type of the others.
pub fn block<'a, I: Into<i128>>(addr: I, size: I, requested: I, state: &'a str) -> V<'a> {
    V::Dict(vec![
        ("address", V::Int(addr.into())),
        ("size", V::Int(size.into())),
        ("requested_size", V::Int(requested.into())),
        ("state", V::Str(state)),
    ])
}

/// A snapshot with one 1 MiB segment at 0x100000 (and no live blocks) and device 0's `events`.
pub fn snapshot(events: Vec<V>) -> Vec<u8> {
    let seg = V::Dict(vec![
        ("device", V::Int(0)),
        ("address", V::Int(0x100000)),
        ("total_size", V::Int(0x100000)),
        ("blocks", V::List(vec![V::Dict(vec![("size", V::Int(0x100000)), ("state", V::Str("inactive"))])])),
    ]);
    pickle(&V::Dict(vec![("segments", V::List(vec![seg])), ("device_traces", V::List(vec![V::List(events)]))]))
}
