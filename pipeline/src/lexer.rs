//! The tokenizer of dataset expressions: identifiers, integers (text kept, sign included),
//! floats, quoted strings with escapes (`\"`, `\\`, `\n`, `\t`, `\r`, `\xNN`) and single-char
//! punctuation, each with its 1-based column (in characters) for error messages.

use sluice_element::DatasetError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    /// Integer literal text, sign included.
    Int(String),
    Float(f64),
    Str(Vec<u8>),
    Punct(char),
    End,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) col: usize,
    /// The source text, for "found '...'".
    pub(crate) text: String,
}

impl Token {
    pub(crate) fn found(&self) -> String {
        match self.tok {
            Tok::End => "end of input".to_string(),
            _ => format!("'{}'", self.text),
        }
    }
}

pub(crate) fn parse_error(column: usize, detail: impl std::fmt::Display) -> DatasetError {
    DatasetError::Parse {
        column,
        message: format!("invalid dataset expression at column {column}: {detail}"),
    }
}

pub(crate) fn tokenize(expr: &str) -> Result<Vec<Token>, DatasetError> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            Tok::Ident(chars[start..i].iter().collect())
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            i += 1;
            let mut is_float = false;
            while i < chars.len() {
                let d = chars[i];
                if d.is_ascii_digit() {
                    i += 1;
                } else if d == '.'
                    && !is_float
                    && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                {
                    is_float = true;
                    i += 1;
                } else if (d == 'e' || d == 'E')
                    && (chars.get(i + 1).is_some_and(char::is_ascii_digit)
                        || (matches!(chars.get(i + 1), Some('+' | '-'))
                            && chars.get(i + 2).is_some_and(char::is_ascii_digit)))
                {
                    is_float = true;
                    i += 2;
                } else {
                    break;
                }
            }
            let text: String = chars[start..i].iter().collect();
            if is_float {
                let v = text
                    .parse::<f64>()
                    .map_err(|_| parse_error(start + 1, format!("invalid number '{text}'")))?;
                Tok::Float(v)
            } else {
                Tok::Int(text)
            }
        } else if c == '"' || c == '\'' {
            i += 1;
            let mut bytes = Vec::new();
            loop {
                let Some(&d) = chars.get(i) else {
                    return Err(parse_error(start + 1, "unterminated string literal"));
                };
                i += 1;
                if d == c {
                    break;
                }
                if d != '\\' {
                    let mut buf = [0u8; 4];
                    bytes.extend_from_slice(d.encode_utf8(&mut buf).as_bytes());
                    continue;
                }
                let esc_col = i;
                match chars.get(i) {
                    Some('n') => bytes.push(b'\n'),
                    Some('t') => bytes.push(b'\t'),
                    Some('r') => bytes.push(b'\r'),
                    Some('\\') => bytes.push(b'\\'),
                    Some('"') => bytes.push(b'"'),
                    Some('\'') => bytes.push(b'\''),
                    Some('x') => {
                        let hex: String = chars.iter().skip(i + 1).take(2).collect();
                        let b = u8::from_str_radix(&hex, 16)
                            .ok()
                            .filter(|_| {
                                hex.len() == 2 && hex.chars().all(|h| h.is_ascii_hexdigit())
                            })
                            .ok_or_else(|| {
                                parse_error(esc_col, "expected two hex digits after '\\x'")
                            })?;
                        bytes.push(b);
                        i += 2;
                    }
                    Some(other) => {
                        return Err(parse_error(esc_col, format!("unknown escape '\\{other}'")))
                    }
                    None => return Err(parse_error(start + 1, "unterminated string literal")),
                }
                i += 1;
            }
            Tok::Str(bytes)
        } else {
            i += 1;
            Tok::Punct(c)
        };
        out.push(Token {
            tok,
            col: start + 1,
            text: chars[start..i].iter().collect(),
        });
    }
    out.push(Token {
        tok: Tok::End,
        col: chars.len() + 1,
        text: String::new(),
    });
    Ok(out)
}
