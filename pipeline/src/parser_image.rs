//! The arguments of the image ops in the expression syntax: `decode_image(key="k",
//! channels=3)` (keywords in any order, both optional) and `resize(h, w, key="k")`. Sides are
//! checked against `MAX_IMAGE_SIDE` here, so a bad size is an error with its column.

use sluice_element::DatasetError;

use super::Parser;
use crate::image_spec::MAX_IMAGE_SIDE;
use crate::lexer::parse_error;

impl Parser {
    /// `decode_image`'s keyword arguments, in any order: `key="name"`, `channels=1|3|4`
    /// (default 3). Leaves the closing `)` for `close`.
    pub(super) fn decode_image_args(&mut self) -> Result<(Option<String>, u32), DatasetError> {
        let (mut key, mut channels) = (None, 3);
        while !self.is_punct(')') {
            if self.keyword("key") {
                key = Some(self.string_arg("a dict key")?);
            } else if self.keyword("channels") {
                let col = self.peek().col;
                let c = self.u64_arg("channels")?;
                channels = match c {
                    1 | 3 | 4 => c as u32,
                    _ => {
                        return Err(parse_error(
                            col,
                            format!("channels must be 1, 3 or 4, found {c}"),
                        ))
                    }
                };
            } else {
                return Err(self.unexpected("'key=', 'channels=' or ')'"));
            }
            if !self.more_args()? {
                break;
            }
        }
        Ok((key, channels))
    }

    /// An image side: positive and at most `MAX_IMAGE_SIDE`.
    fn image_side_arg(&mut self, what: &str) -> Result<u64, DatasetError> {
        let col = self.peek().col;
        let v = self.positive_arg(what)?;
        if v > MAX_IMAGE_SIDE {
            return Err(parse_error(
                col,
                format!("{what} must be at most {MAX_IMAGE_SIDE}, found {v}"),
            ));
        }
        Ok(v)
    }

    /// `resize`'s arguments: height, width, then optionally `key="name"`. Leaves the closing
    /// `)` for `close`.
    pub(super) fn resize_args(&mut self) -> Result<(u64, u64, Option<String>), DatasetError> {
        let height = self.image_side_arg("resize height")?;
        self.expect_punct(',', "','")?;
        let width = self.image_side_arg("resize width")?;
        let mut key = None;
        if self.more_args()? {
            if !self.keyword("key") {
                return Err(self.unexpected("'key='"));
            }
            key = Some(self.string_arg("a dict key")?);
        }
        Ok((height, width, key))
    }
}
