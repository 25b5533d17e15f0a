//! Reader for RMM `logging_resource_adaptor` CSV logs:
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 2342727,15:47:02.841961,allocate,0x10012400000,1048576,0x0
//! ```
//!
//! * `Time` is spdlog's time of day `HH:MM:SS.ffffff` (or seconds as a decimal number); it
//!   becomes microseconds since midnight of the first row's day, a wrap past midnight adding a day;
//! * `Action` is `allocate` ([`EventKind::Alloc`]), `free` or `deallocate` ([`EventKind::Free`]),
//!   or `allocate failure` ([`EventKind::Oom`]);
//! * `Pointer` and `Stream` are hexadecimal (`0x...`) or decimal; `Size` is bytes.
//!
//! The device is taken from a `.dev<N>` part of the file name (`rmm.enable_logging` names files
//! so), else 0. Rows are kept in file order; the thread id is not kept. RMM logs every allocation
//! made through the adaptor, so a free of an address never allocated is an error, and so is a free
//! whose `Size` differs from its allocation's (RMM's `deallocate` contract: the size passed to
//! `allocate`).

use std::path::Path;

use super::csv_lifetime::{csv_error, parse_uint};
use super::validate::{assign_ids, check_free_sizes};
use super::{
    AddressKind, DeviceTrace, Event, EventKind, Location, TimeUnit, Trace, TraceError, TraceFormat, ValidationError,
    NO_ID,
};

const DAY_US: i64 = 86_400_000_000;

fn parse_hex_or_dec(cell: &str) -> Option<u64> {
    let c = cell.trim();
    if let Some(h) = c.strip_prefix("0x").or_else(|| c.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    if matches!(c, "(nil)" | "nullptr" | "NULL" | "null") {
        return Some(0);
    }
    c.parse::<u64>().ok().or_else(|| u64::from_str_radix(c, 16).ok())
}

/// `HH:MM:SS.ffffff` or decimal seconds, to microseconds.
fn parse_time(cell: &str) -> Option<i64> {
    let c = cell.trim();
    let parts: Vec<&str> = c.split(':').collect();
    let secs_to_us = |s: &str| -> Option<i64> {
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut us: i64 = whole.parse::<i64>().ok()?.checked_mul(1_000_000)?;
        let frac6: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
        us = us.checked_add(frac6.parse::<i64>().ok()?)?;
        Some(us)
    };
    match parts.as_slice() {
        [h, m, s] => {
            let h: i64 = h.parse().ok().filter(|h| (0..24).contains(h))?;
            let m: i64 = m.parse().ok().filter(|m| (0..60).contains(m))?;
            Some((h * 3600 + m * 60) * 1_000_000 + secs_to_us(s)?)
        }
        [s] => secs_to_us(s),
        _ => None,
    }
}

/// The `N` of a `.devN` in the file name.
fn device_from_name(path: &Path) -> i64 {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.split('.').filter_map(|part| part.strip_prefix("dev")).find_map(|n| n.parse::<i64>().ok()).unwrap_or(0)
}

/// Parses an RMM log (`bytes` is the content of `path`, used in messages).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Trace, TraceError> {
    if bytes.is_empty() {
        return Err(TraceError::Empty { path: path.to_path_buf() });
    }
    let mut rdr = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(bytes);
    let header = rdr.headers().map_err(|e| csv_error(path, &e))?.clone();
    let want = ["thread", "time", "action", "pointer", "size", "stream"];
    if header.len() != want.len() || !header.iter().zip(want).all(|(h, w)| h.eq_ignore_ascii_case(w)) {
        return Err(TraceError::schema(
            path,
            Location::Line(1),
            "header is not `Thread,Time,Action,Pointer,Size,Stream`",
        ));
    }
    let mut events = Vec::new();
    let mut lines = Vec::new();
    let mut record = csv::StringRecord::new();
    let (mut day, mut last) = (0i64, None::<i64>);
    loop {
        match rdr.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(path, &e)),
        }
        let line = record.position().map(|p| p.line()).unwrap_or(0);
        let bad = |msg: String| TraceError::schema(path, Location::Line(line), msg);
        let t = parse_time(&record[1])
            .ok_or_else(|| bad(format!("column `Time`: cannot read {} as a time", super::excerpt(&record[1]))))?;
        if let Some(prev) = last {
            // A time of day that jumps back by more than 12 h crossed midnight.
            if t.saturating_add(day) < prev.saturating_sub(DAY_US / 2) {
                day = day.saturating_add(DAY_US);
            }
        }
        let t = t.saturating_add(day);
        last = Some(t);
        let kind = match record[2].to_ascii_lowercase().as_str() {
            "allocate" => EventKind::Alloc,
            "free" | "deallocate" => EventKind::Free,
            "allocate failure" | "allocate_failure" => EventKind::Oom,
            other => return Err(bad(format!("column `Action`: unknown action {}", super::excerpt(other)))),
        };
        let addr = parse_hex_or_dec(&record[3]).ok_or_else(|| {
            bad(format!("column `Pointer`: cannot read {} as an address", super::excerpt(&record[3])))
        })?;
        let size = parse_uint(path, line, "Size", &record[4], u64::MAX)?;
        let stream = parse_hex_or_dec(&record[5])
            .ok_or_else(|| bad(format!("column `Stream`: cannot read {} as a stream", super::excerpt(&record[5]))))?;
        let addr = if kind == EventKind::Oom { 0 } else { addr };
        events.push(Event { kind, mempool: 0, id: NO_ID, addr, size, stream: stream as i64, time_us: Some(t) });
        lines.push(line);
    }
    let mut dt = DeviceTrace::new(device_from_name(path));
    dt.events = events;
    let event_error = |e: ValidationError| TraceError::Event {
        path: path.to_path_buf(),
        format: TraceFormat::RmmLog,
        at: Location::Line(lines.get(e.index).copied().unwrap_or(0)),
        source: Box::new(e),
    };
    assign_ids(&mut dt, AddressKind::Device).map_err(event_error)?;
    check_free_sizes(&dt).map_err(event_error)?;
    dt.ooms = dt
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EventKind::Oom)
        .map(|(i, _)| super::OomInfo { event: i, device_free: None })
        .collect();
    Ok(Trace {
        source: path.to_path_buf(),
        format: TraceFormat::RmmLog,
        addresses: AddressKind::Device,
        time_unit: TimeUnit::Microseconds,
        devices: vec![dt],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("15:47:02.841961"), Some(((15 * 3600 + 47 * 60 + 2) * 1_000_000) + 841_961));
        assert_eq!(parse_time("1601925133.5"), Some(1_601_925_133_500_000));
        assert_eq!(parse_time("25:00:00.0"), None);
        assert_eq!(parse_time("x"), None);
    }

    #[test]
    fn device_suffix() {
        assert_eq!(device_from_name(Path::new("/x/rmm_log.dev3.csv")), 3);
        assert_eq!(device_from_name(Path::new("log.csv")), 0);
    }
}
