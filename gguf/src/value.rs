//! Metadata values: the thirteen GGUF value types, typed arrays (nested too), and [`Metadata`], the
//! ordered key → value table of a file with typed getters.

use super::error::{GgufError, GgufErrorKind};
use std::collections::HashMap;
use std::fmt;

/// The type tag of a metadata value, with GGUF's numeric ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8` (id 0).
    U8,
    /// `i8` (id 1).
    I8,
    /// `u16` (id 2).
    U16,
    /// `i16` (id 3).
    I16,
    /// `u32` (id 4).
    U32,
    /// `i32` (id 5).
    I32,
    /// `f32` (id 6).
    F32,
    /// `bool`, one byte (id 7).
    Bool,
    /// UTF-8 string with a `u64` length (id 8).
    String,
    /// Array: element type, `u64` count, elements (id 9).
    Array,
    /// `u64` (id 10).
    U64,
    /// `i64` (id 11).
    I64,
    /// `f64` (id 12).
    F64,
}

impl ValueType {
    /// Every value type, in id order.
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// GGUF's id of the type.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The type of GGUF id `id`, if there is one.
    pub fn from_id(id: u32) -> Option<ValueType> {
        ValueType::ALL.get(usize::try_from(id).ok()?).copied()
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The fewest bytes one value of this type occupies in a file (a string is at least its
    /// length, an array at least its element type and count). Used to cap counts before
    /// allocating.
    pub const fn min_encoded_size(self) -> usize {
        match self.fixed_size() {
            Some(n) => n,
            None if matches!(self, ValueType::String) => 8,
            None => 12,
        }
    }

    /// Lower-case name (`u32`, `string`, `array`).
    pub const fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A string (invalid UTF-8 in a file is replaced by U+FFFD).
    String(String),
    /// An array of one element type.
    Array(Array),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A description of the type for error messages: `u32`, `array of string`,
    /// `array of array`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as a `u64` if it is an integer of any width that is not negative.
    pub fn to_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// An array value: one element type, stored typed.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Nested arrays, each with its own element type.
    Array(Vec<Array>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An empty array of element type `t`.
    pub fn empty(t: ValueType) -> Array {
        match t {
            ValueType::U8 => Array::U8(Vec::new()),
            ValueType::I8 => Array::I8(Vec::new()),
            ValueType::U16 => Array::U16(Vec::new()),
            ValueType::I16 => Array::I16(Vec::new()),
            ValueType::U32 => Array::U32(Vec::new()),
            ValueType::I32 => Array::I32(Vec::new()),
            ValueType::F32 => Array::F32(Vec::new()),
            ValueType::Bool => Array::Bool(Vec::new()),
            ValueType::String => Array::String(Vec::new()),
            ValueType::Array => Array::Array(Vec::new()),
            ValueType::U64 => Array::U64(Vec::new()),
            ValueType::I64 => Array::I64(Vec::new()),
            ValueType::F64 => Array::F64(Vec::new()),
        }
    }
}

macro_rules! impl_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$v(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$v(v))
            }
        }
    )*};
}

impl_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_string())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Value {
        Value::Array(v)
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(str::to_string).collect()))
    }
}

/// The metadata of a GGUF file: keys in file order, each once, with typed getters.
///
/// Getters fail with [`GgufErrorKind::MissingKey`] or [`GgufErrorKind::WrongType`] (naming the key,
/// the wanted type and the actual one); the error carries the file name when the metadata came
/// from a file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    source: String,
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! scalar_getter {
    ($($(#[$doc:meta])* $name:ident -> $t:ty = $v:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        /// The key is missing or holds another type.
        pub fn $name(&self, key: &str) -> Result<$t, GgufError> {
            match self.value(key)? {
                Value::$v(x) => Ok(*x),
                other => Err(self.wrong_type(key, ValueType::$v.name(), other)),
            }
        }
    )*};
}

macro_rules! array_getter {
    ($($(#[$doc:meta])* $name:ident -> $t:ty = $v:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        /// The key is missing or is not an array of that element type.
        pub fn $name(&self, key: &str) -> Result<&[$t], GgufError> {
            match self.value(key)? {
                Value::Array(Array::$v(x)) => Ok(x),
                other => Err(self.wrong_type(
                    key,
                    &format!("array of {}", ValueType::$v.name()),
                    other,
                )),
            }
        }
    )*};
}

impl Metadata {
    /// An empty table whose errors name `source` (a file path, or a description).
    pub fn new(source: impl Into<String>) -> Metadata {
        Metadata {
            source: source.into(),
            ..Metadata::default()
        }
    }

    /// Adds `key`.
    ///
    /// # Errors
    /// [`GgufErrorKind::DuplicateKey`] if the key is already present.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        let key = key.into();
        if self.index.contains_key(&key) {
            return Err(GgufError::new(
                &self.source,
                GgufErrorKind::DuplicateKey { key },
            ));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value.into()));
        Ok(())
    }

    /// Sets `key`, replacing a previous value in place (its position is kept).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value.into(),
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value.into()));
            }
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file (or description) errors name.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`GgufErrorKind::MissingKey`] if it is absent.
    pub fn value(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| {
            GgufError::new(
                &self.source,
                GgufErrorKind::MissingKey {
                    key: key.to_string(),
                },
            )
        })
    }

    fn wrong_type(&self, key: &str, expected: &str, actual: &Value) -> GgufError {
        GgufError::new(
            &self.source,
            GgufErrorKind::WrongType {
                key: key.to_string(),
                expected: expected.to_string(),
                actual: actual.type_description(),
            },
        )
    }

    scalar_getter! {
        /// The `u8` value of `key`.
        get_u8 -> u8 = U8;
        /// The `i8` value of `key`.
        get_i8 -> i8 = I8;
        /// The `u16` value of `key`.
        get_u16 -> u16 = U16;
        /// The `i16` value of `key`.
        get_i16 -> i16 = I16;
        /// The `u32` value of `key`.
        get_u32 -> u32 = U32;
        /// The `i32` value of `key`.
        get_i32 -> i32 = I32;
        /// The `f32` value of `key`.
        get_f32 -> f32 = F32;
        /// The `bool` value of `key`.
        get_bool -> bool = Bool;
        /// The `u64` value of `key`.
        get_u64 -> u64 = U64;
        /// The `i64` value of `key`.
        get_i64 -> i64 = I64;
        /// The `f64` value of `key`.
        get_f64 -> f64 = F64;
    }

    array_getter! {
        /// The `u8` array of `key`.
        get_u8_array -> u8 = U8;
        /// The `u32` array of `key`.
        get_u32_array -> u32 = U32;
        /// The `i32` array of `key`.
        get_i32_array -> i32 = I32;
        /// The `f32` array of `key`.
        get_f32_array -> f32 = F32;
        /// The string array of `key`.
        get_str_array -> String = String;
    }

    /// The string value of `key`.
    ///
    /// # Errors
    /// The key is missing or holds another type.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            other => Err(self.wrong_type(key, "string", other)),
        }
    }

    /// The array value of `key`, of any element type.
    ///
    /// # Errors
    /// The key is missing or is not an array.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.value(key)? {
            Value::Array(a) => Ok(a),
            other => Err(self.wrong_type(key, "array", other)),
        }
    }

    /// The value of `key` as a `u64`, accepting any integer type whose value is not negative
    /// (files disagree on the width of counts and ids).
    ///
    /// # Errors
    /// The key is missing, not an integer, or negative.
    pub fn get_uint(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.value(key)?;
        v.to_u64()
            .ok_or_else(|| self.wrong_type(key, "non-negative integer", v))
    }

    /// [`Metadata::get_uint`] converted to `usize`.
    ///
    /// # Errors
    /// As [`Metadata::get_uint`]; [`GgufErrorKind::InvalidValue`] if it does not fit.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let v = self.get_uint(key)?;
        usize::try_from(v).map_err(|_| {
            GgufError::new(
                &self.source,
                GgufErrorKind::InvalidValue {
                    key: key.to_string(),
                    reason: format!("{v} does not fit in usize"),
                },
            )
        })
    }

    /// The value of `key` as an `f32`, accepting `f32` or `f64`.
    ///
    /// # Errors
    /// The key is missing or holds another type.
    pub fn get_float(&self, key: &str) -> Result<f32, GgufError> {
        match self.value(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            other => Err(self.wrong_type(key, "f32", other)),
        }
    }
}
