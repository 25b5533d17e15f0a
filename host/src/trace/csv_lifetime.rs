//! Reader for buffer-lifetime CSV files, minimalloc's input format:
//!
//! ```text
//! id,lower,upper,size
//! 0,277504,279552,528384
//! ```
//!
//! Each row is one buffer of `size` bytes alive over the half-open interval `[lower, upper)` of
//! abstract time. It becomes an [`EventKind::Alloc`] at `lower` and an [`EventKind::Free`] at
//! `upper`; events are ordered by time, frees before allocs at equal times (so a buffer ending at
//! `t` and one starting at `t` may share memory), then by row. The file has no addresses: each
//! event's `addr` is the buffer's 0-based data row ([`AddressKind::Handle`]). Extra columns (e.g.
//! a solution's `offset`) are ignored.

use std::collections::HashMap;
use std::path::Path;

use super::validate::assign_ids;
use super::{AddressKind, DeviceTrace, Event, EventKind, Location, TimeUnit, Trace, TraceError, TraceFormat, NO_ID};

/// Parses one CSV cell as a non-negative integer that fits in `i64` (times) or `u64` (sizes).
pub(crate) fn parse_uint(path: &Path, line: u64, column: &str, cell: &str, max: u64) -> Result<u64, TraceError> {
    let cell = cell.trim();
    let bad = |msg: String| TraceError::schema(path, Location::Line(line), format!("column `{column}`: {msg}"));
    if let Some(rest) = cell.strip_prefix('-') {
        if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("negative value {}", super::excerpt_plain(cell))));
        }
    }
    if cell.is_empty() || !cell.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!("expected a non-negative integer, found {}", super::excerpt(cell))));
    }
    match cell.parse::<u64>() {
        Ok(v) if v <= max => Ok(v),
        _ => Err(bad(format!(
            "value {} does not fit in {} bits",
            super::excerpt_plain(cell),
            if max == u64::MAX { 64 } else { 63 }
        ))),
    }
}

/// Maps a `csv` crate error to a one-line [`TraceError`] at its line.
pub(crate) fn csv_error(path: &Path, e: &csv::Error) -> TraceError {
    let line = e.position().map(|p| p.line()).unwrap_or(0);
    let msg = match e.kind() {
        csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
            format!("expected {expected_len} fields, found {len}")
        }
        csv::ErrorKind::Utf8 { .. } => "not valid UTF-8".to_string(),
        _ => e.to_string(),
    };
    TraceError::schema(path, Location::Line(line), msg)
}

/// Parses a lifetime CSV (`bytes` is the content of `path`, used in messages).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    if bytes.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    let mut rdr = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(bytes);
    let header = rdr.headers().map_err(|e| csv_error(path, &e))?.clone();
    let col = |name: &str| {
        header.iter().position(|h| h.eq_ignore_ascii_case(name)).ok_or_else(|| {
            TraceError::schema(path, Location::Line(1), format!("missing column `{name}` (need id,lower,upper,size)"))
        })
    };
    let (c_id, c_lower, c_upper, c_size) = (col("id")?, col("lower")?, col("upper")?, col("size")?);

    // (time, 0 = free / 1 = alloc, row)
    let mut order: Vec<(u64, u8, u32)> = Vec::new();
    let mut sizes: Vec<u64> = Vec::new();
    let mut lines: Vec<u64> = Vec::new();
    let mut ids: HashMap<String, u64> = HashMap::new();
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(path, &e)),
        }
        let line = record.position().map(|p| p.line()).unwrap_or(0);
        let row =
            u32::try_from(sizes.len()).map_err(|_| TraceError::schema(path, Location::Line(line), "too many rows"))?;
        let id = &record[c_id];
        if let Some(first) = ids.insert(id.to_string(), line) {
            return Err(TraceError::schema(
                path,
                Location::Line(line),
                format!("duplicate id {} (first on line {first})", super::excerpt(id)),
            ));
        }
        let lower = parse_uint(path, line, "lower", &record[c_lower], i64::MAX as u64)?;
        let upper = parse_uint(path, line, "upper", &record[c_upper], i64::MAX as u64)?;
        let size = parse_uint(path, line, "size", &record[c_size], u64::MAX)?;
        if upper <= lower {
            let msg =
                format!("empty lifetime: upper {upper} is not after lower {lower} (lifetimes are [lower, upper))");
            return Err(TraceError::schema(path, Location::Line(line), msg));
        }
        order.push((lower, 1, row));
        order.push((upper, 0, row));
        sizes.push(size);
        lines.push(line);
    }
    order.sort_unstable();

    let mut dt = DeviceTrace::new(0);
    dt.events = order
        .into_iter()
        .map(|(t, alloc, row)| Event {
            kind: if alloc == 1 { EventKind::Alloc } else { EventKind::Free },
            mempool: 0,
            id: NO_ID,
            addr: row as u64,
            size: sizes[row as usize],
            stream: 0,
            time_us: Some(t as i64),
        })
        .collect();
    assign_ids(&mut dt, AddressKind::Handle).map_err(|e| {
        let line = lines.get(dt.events[e.index].addr as usize).copied().unwrap_or(0);
        TraceError::Event {
            path: path.to_path_buf(),
            format: TraceFormat::LifetimeCsv,
            at: Location::Line(line),
            source: Box::new(e),
        }
    })?;
    Ok(Trace {
        source: path.to_path_buf(),
        format: TraceFormat::LifetimeCsv,
        addresses: AddressKind::Handle,
        time_unit: TimeUnit::Ticks,
        devices: vec![dt],
    })
}
