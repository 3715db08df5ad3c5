//! What keeps a hostile chat template bounded in time and memory beyond minijinja's fuel, which
//! counts instructions but not the work inside one: an emit of a billion-item lazy sequence, or a
//! filter that materialises one.

use minijinja::value::{Rest, Value};
use minijinja::{Environment, Error, ErrorKind, State};
use std::io;

/// The most items a sequence may have when a filter materialises or walks it. Conversations
/// have tens to thousands of messages; a template that builds a million-item list is hostile.
pub(super) const MAX_FILTER_ITEMS: usize = 1 << 20;

/// Builtin filters that walk or copy their whole input in one instruction.
const SEQUENCE_FILTERS: &[&str] = &[
    "batch",
    "dictsort",
    "groupby",
    "items",
    "join",
    "last",
    "list",
    "map",
    "max",
    "min",
    "reject",
    "rejectattr",
    "reverse",
    "select",
    "selectattr",
    "slice",
    "sort",
    "string",
    "sum",
    "tojson",
    "unique",
];

/// Re-registers [`SEQUENCE_FILTERS`] so that each refuses an input longer than
/// [`MAX_FILTER_ITEMS`] before the builtin runs.
pub(super) fn guard_sequence_filters(env: &mut Environment<'_>) {
    for &name in SEQUENCE_FILTERS {
        let Some(builtin) = builtin_filter(name) else {
            continue;
        };
        env.add_filter(name, move |state: &State, args: Rest<Value>| {
            if let Some(v) = args.first() {
                check_items(v, &format!("filter `{name}`"))?;
            }
            builtin.call(state, &args)
        });
    }
}

/// The default formatter behind the same guard: printing a value walks every item even once
/// the output is full (`fmt::DebugList` keeps iterating after a write error).
pub(super) fn guard_output(env: &mut Environment<'_>) {
    env.set_formatter(|out, state, value| {
        check_items(value, "output")?;
        minijinja::escape_formatter(out, state, value)
    });
}

/// Refuses a value holding more than [`MAX_FILTER_ITEMS`] items in all, nested sequences and
/// maps included. The walk stops as soon as the count is over, so it costs at most that many
/// steps whatever the value.
fn check_items(value: &Value, what: &str) -> Result<(), Error> {
    let mut budget = MAX_FILTER_ITEMS;
    if count_items(value, &mut budget, 0) {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what} on a value of more than {MAX_FILTER_ITEMS} items"),
        ))
    }
}

/// Deeper nesting than this is counted as over budget (each level is a native stack frame).
const MAX_DEPTH: usize = 64;

/// Takes `value`'s items from `budget`; false once it is exhausted.
fn count_items(value: &Value, budget: &mut usize, depth: usize) -> bool {
    use minijinja::value::ValueKind;
    if !matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    ) {
        return true;
    }
    if depth > MAX_DEPTH {
        return false;
    }
    // An unsized iterable is counted item by item below; a sized one is refused up front.
    if let Some(len) = value.len()
        && len > *budget
    {
        return false;
    }
    let Ok(iter) = value.try_iter() else {
        return true;
    };
    for key in iter {
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        let item = if value.kind() == ValueKind::Map {
            value.get_item(&key).unwrap_or_default()
        } else {
            key
        };
        if !count_items(&item, budget, depth + 1) {
            return false;
        }
    }
    true
}

/// The builtin filter `name` as a callable value.
fn builtin_filter(name: &str) -> Option<Value> {
    use minijinja::filters as f;
    Some(match name {
        "batch" => Value::from_function(f::batch),
        "dictsort" => Value::from_function(f::dictsort),
        "groupby" => Value::from_function(f::groupby),
        "items" => Value::from_function(f::items),
        "join" => Value::from_function(f::join),
        "last" => Value::from_function(f::last),
        "list" => Value::from_function(f::list),
        "map" => Value::from_function(f::map),
        "max" => Value::from_function(f::max),
        "min" => Value::from_function(f::min),
        "reject" => Value::from_function(f::reject),
        "rejectattr" => Value::from_function(f::rejectattr),
        "reverse" => Value::from_function(f::reverse),
        "select" => Value::from_function(f::select),
        "selectattr" => Value::from_function(f::selectattr),
        "slice" => Value::from_function(f::slice),
        "sort" => Value::from_function(f::sort),
        "string" => Value::from_function(f::string),
        "sum" => Value::from_function(f::sum),
        "tojson" => Value::from_function(f::tojson),
        "unique" => Value::from_function(f::unique),
        _ => return None,
    })
}

/// Collects rendered bytes up to a limit; past it every write fails, which stops minijinja's
/// render at the next write (a huge value's `Display` fails on its first item past the limit).
pub(super) struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl CappedWriter {
    pub(super) fn new(limit: usize) -> CappedWriter {
        CappedWriter {
            buf: Vec::new(),
            limit,
            overflowed: false,
        }
    }

    /// Whether a write went past the limit (the render was cut there).
    pub(super) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The text; minijinja writes only whole `str`s, so it is UTF-8 (checked all the same).
    pub(super) fn into_string(self) -> String {
        String::from_utf8(self.buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("rendered prompt too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
