//! Tensor shape and dtype to bytes, and to the aligned allocation size.
//!
//! ```
//! use gpuheap::reference::sizes::{tensor_bytes, alloc_size, DType};
//! assert_eq!(tensor_bytes(&[1024, 1024], DType::F16), Ok(2 << 20));
//! assert_eq!(alloc_size(&[3], DType::F32, 512), Ok(512));
//! ```

use std::fmt;
use std::str::FromStr;

use super::{align_up, AllocError, MAX_BYTES};

/// CUDA caching allocators round every request up to 512 bytes (PyTorch's `kMinBlockSize`).
#[doc(hidden)]
pub const DEFAULT_ALLOC_ALIGN: u64 = 512;

/// Element types, with their size in bytes from [`DType::size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 8 bytes.
    F64,
    /// 4 bytes.
    F32,
    /// 2 bytes.
    F16,
    /// 2 bytes.
    BF16,
    /// 1 byte (e4m3 / e5m2).
    Fp8,
    /// 8 bytes.
    I64,
    /// 4 bytes.
    I32,
    /// 1 byte.
    I8,
    /// 1 byte.
    Bool,
}

impl DType {
    /// Element size in bytes.
    #[doc(hidden)]
    pub const fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Fp8 | DType::I8 | DType::Bool => 1,
        }
    }

    /// Canonical lower-case name (`f64`, `f32`, `f16`, `bf16`, `fp8`, `i64`, `i32`, `i8`, `bool`).
    #[doc(hidden)]
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Fp8 => "fp8",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`DType::from_str`].
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("unknown dtype `{0}`")]
#[non_exhaustive]
#[doc(hidden)]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    /// Accepts the canonical names and the common PyTorch spellings (`float32`, `torch.half`, `float8_e4m3fn`…).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix("torch.").unwrap_or(&t);
        Ok(match t {
            "f64" | "float64" | "double" => DType::F64,
            "f32" | "float32" | "float" => DType::F32,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "fp8" | "f8" | "float8_e4m3fn" | "float8_e5m2" | "float8_e4m3fnuz" | "float8_e5m2fnuz" => DType::Fp8,
            "i64" | "int64" | "long" => DType::I64,
            "i32" | "int32" | "int" => DType::I32,
            "i8" | "int8" | "u8" | "uint8" => DType::I8,
            "bool" => DType::Bool,
            _ => return Err(UnknownDType(s.to_string())),
        })
    }
}

/// Bytes of a dense tensor of `shape` and `dtype` (an empty shape is a scalar: one element).
///
/// # Errors
/// [`AllocError::SizeOverflow`] if the product overflows `u64` or exceeds 2^48 bytes.
pub fn tensor_bytes(shape: &[u64], dtype: DType) -> Result<u64, AllocError> {
    let mut bytes = dtype.size();
    for &d in shape {
        bytes = bytes.checked_mul(d).ok_or(AllocError::SizeOverflow { size: u64::MAX })?;
    }
    if bytes > MAX_BYTES {
        return Err(AllocError::SizeOverflow { size: bytes });
    }
    Ok(bytes)
}

/// [`tensor_bytes`] rounded up to `align` bytes (a power of two; [`DEFAULT_ALLOC_ALIGN`] models CUDA caching
/// allocators). A zero-element tensor needs 0 bytes.
///
/// # Errors
/// [`AllocError::BadAlignment`] if `align` is not a power of two; [`AllocError::SizeOverflow`] as
/// [`tensor_bytes`] or when rounding overflows.
#[doc(hidden)]
pub fn alloc_size(shape: &[u64], dtype: DType, align: u64) -> Result<u64, AllocError> {
    super::check_align(align)?;
    let bytes = tensor_bytes(shape, dtype)?;
    align_up(bytes, align).filter(|&r| r <= MAX_BYTES).ok_or(AllocError::SizeOverflow { size: bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_rounding() {
        assert_eq!(tensor_bytes(&[], DType::F64), Ok(8));
        assert_eq!(tensor_bytes(&[2, 3, 0], DType::F32), Ok(0));
        assert_eq!(tensor_bytes(&[7], DType::Fp8), Ok(7));
        assert_eq!(alloc_size(&[7], DType::BF16, DEFAULT_ALLOC_ALIGN), Ok(512));
        assert_eq!(alloc_size(&[257], DType::F16, 512), Ok(1024));
        assert_eq!(alloc_size(&[1], DType::Bool, 3), Err(AllocError::BadAlignment { align: 3 }));
        assert!(matches!(tensor_bytes(&[u64::MAX, 2], DType::I8), Err(AllocError::SizeOverflow { .. })));
        assert!(matches!(tensor_bytes(&[1 << 46], DType::I64), Err(AllocError::SizeOverflow { .. })));
        assert_eq!(tensor_bytes(&[1 << 45], DType::I64), Ok(1 << 48));
        assert_eq!("torch.bfloat16".parse::<DType>(), Ok(DType::BF16));
        assert_eq!("float8_e4m3fn".parse::<DType>(), Ok(DType::Fp8));
        assert!("complex64".parse::<DType>().is_err());
        for d in [
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Fp8,
            DType::I64,
            DType::I32,
            DType::I8,
            DType::Bool,
        ] {
            assert_eq!(d.to_string().parse::<DType>(), Ok(d));
        }
    }
}
