//! Whether a sequential JPEG's scans hold every block its frame promises. zune-jpeg (under
//! `image`) takes a marker inside the entropy-coded data as the end of the data and decodes
//! the missing blocks as grey, so half a JPEG with `FF D9` appended decodes "fine". This walks
//! the Huffman codes of each scan (no dequantisation, no IDCT), counting blocks, and reports a
//! scan that reaches a marker before its last block. Progressive and other non-baseline frames
//! are not walked: their later scans refine the image, and one that ends early is a coarser
//! image, not a missing part.

/// Why a JPEG's scans do not hold the whole image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScanDefect {
    /// A scan reached a marker (or the end of the file) before its last block.
    EndsEarly,
    /// The headers or the entropy-coded data are not valid JPEG.
    Invalid(&'static str),
}

/// Checks every scan of a baseline or extended sequential (Huffman) JPEG; other frames pass.
pub(crate) fn check(bytes: &[u8]) -> Result<(), ScanDefect> {
    let mut parser = Parser::default();
    let mut pos = 2; // after SOI
    while let Some((marker, at)) = next_marker(bytes, pos) {
        pos = at;
        match marker {
            0xD9 => return Ok(()),
            0x01 | 0xD0..=0xD7 => continue,
            _ => {}
        }
        let segment = segment(bytes, pos).ok_or(ScanDefect::Invalid("segment past the end"))?;
        pos += 2 + segment.len();
        match marker {
            0xC0 | 0xC1 => parser.frame = Some(Frame::parse(segment)?),
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return Ok(()),
            0xC4 => parser.read_tables(segment)?,
            0xDD => parser.restart_interval = read_u16(segment, 0).map_or(0, usize::from),
            0xDA => pos = parser.walk_scan(segment, bytes, pos)?,
            _ => {}
        }
    }
    Ok(())
}

/// The next marker at or after `pos`: its code and the offset just past it. Fill bytes
/// (`FF FF`) and stuffed zeros (`FF 00`) are skipped.
fn next_marker(bytes: &[u8], mut pos: usize) -> Option<(u8, usize)> {
    while pos + 1 < bytes.len() {
        if bytes[pos] == 0xFF && !matches!(bytes[pos + 1], 0x00 | 0xFF) {
            return Some((bytes[pos + 1], pos + 2));
        }
        pos += 1;
    }
    None
}

/// The body of the segment whose length field is at `pos`.
fn segment(bytes: &[u8], pos: usize) -> Option<&[u8]> {
    let len = usize::from(read_u16(bytes, pos)?);
    bytes.get(pos + 2..pos.checked_add(len).filter(|_| len >= 2)?)
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// One component of a frame: its id and sampling factors.
#[derive(Debug, Clone, Copy)]
struct Component {
    id: u8,
    h: usize,
    v: usize,
}

/// A frame header: the image size and its components.
#[derive(Debug, Clone)]
struct Frame {
    width: usize,
    height: usize,
    components: Vec<Component>,
}

impl Frame {
    fn parse(s: &[u8]) -> Result<Self, ScanDefect> {
        let bad = ScanDefect::Invalid("frame header");
        let height = usize::from(read_u16(s, 1).ok_or(bad.clone())?);
        let width = usize::from(read_u16(s, 3).ok_or(bad.clone())?);
        let count = usize::from(*s.get(5).ok_or(bad.clone())?);
        let components = (0..count)
            .map(|i| {
                let c = s.get(6 + 3 * i..9 + 3 * i).ok_or(bad.clone())?;
                let (h, v) = (usize::from(c[1] >> 4), usize::from(c[1] & 15));
                if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
                    return Err(bad.clone());
                }
                Ok(Component { id: c[0], h, v })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if components.is_empty() || width == 0 || height == 0 {
            return Err(bad);
        }
        Ok(Frame {
            width,
            height,
            components,
        })
    }

    fn h_max(&self) -> usize {
        self.components.iter().map(|c| c.h).max().unwrap_or(1)
    }

    fn v_max(&self) -> usize {
        self.components.iter().map(|c| c.v).max().unwrap_or(1)
    }
}

/// A Huffman table in the canonical form of the JPEG standard (annex C): per code length, the
/// largest code and where its symbols start.
#[derive(Debug, Clone, Default)]
struct Huffman {
    max_code: [i32; 17],
    offset: [i32; 17],
    symbols: Vec<u8>,
}

impl Huffman {
    fn new(counts: &[u8], symbols: &[u8]) -> Self {
        let mut table = Huffman {
            max_code: [-1; 17],
            offset: [0; 17],
            symbols: symbols.to_vec(),
        };
        let (mut code, mut index) = (0i32, 0i32);
        for len in 1..=16 {
            let n = i32::from(counts[len - 1]);
            table.offset[len] = index - code;
            if n > 0 {
                table.max_code[len] = code + n - 1;
            }
            code = (code + n) << 1;
            index += n;
        }
        table
    }

    fn decode(&self, bits: &mut Bits<'_>) -> Result<u8, ScanDefect> {
        let mut code = 0i32;
        for len in 1..=16 {
            code = (code << 1) | bits.bit()?;
            if code <= self.max_code[len] {
                let at = usize::try_from(code + self.offset[len]).ok();
                return at
                    .and_then(|i| self.symbols.get(i).copied())
                    .ok_or(ScanDefect::Invalid("Huffman table"));
            }
        }
        Err(ScanDefect::Invalid("no Huffman code matches the data"))
    }
}

/// The state the headers set up for the scans.
#[derive(Debug, Default)]
struct Parser {
    frame: Option<Frame>,
    /// DC tables 0-3 then AC tables 0-3.
    tables: [Option<Huffman>; 8],
    restart_interval: usize,
}

impl Parser {
    /// Reads the Huffman tables of a DHT segment.
    fn read_tables(&mut self, mut s: &[u8]) -> Result<(), ScanDefect> {
        let bad = ScanDefect::Invalid("Huffman table segment");
        while let [class_id, rest @ ..] = s {
            let counts = rest.get(..16).ok_or(bad.clone())?;
            let n: usize = counts.iter().map(|&c| usize::from(c)).sum();
            let symbols = rest.get(16..16 + n).ok_or(bad.clone())?;
            let (class, id) = (usize::from(class_id >> 4), usize::from(class_id & 15));
            if class > 1 || id > 3 {
                return Err(bad);
            }
            self.tables[class * 4 + id] = Some(Huffman::new(counts, symbols));
            s = &rest[16 + n..];
        }
        Ok(())
    }

    /// Walks the scan whose header is `header` and whose data starts at `pos`; the offset
    /// where its data ends.
    fn walk_scan(&self, header: &[u8], bytes: &[u8], pos: usize) -> Result<usize, ScanDefect> {
        let frame = self
            .frame
            .as_ref()
            .ok_or(ScanDefect::Invalid("scan before a frame"))?;
        let units = self.scan_units(frame, header)?;
        let (mcus, per_mcu) = mcu_layout(frame, &units);
        let mut bits = Bits::new(bytes, pos);
        for mcu in 0..mcus {
            if self.restart_interval > 0 && mcu > 0 && mcu % self.restart_interval == 0 {
                bits.restart()?;
            }
            for &(dc, ac, blocks) in &per_mcu {
                for _ in 0..blocks {
                    walk_block(dc, ac, &mut bits)?;
                }
            }
        }
        Ok(bits.pos)
    }

    /// Per component of the scan: its frame component and its DC and AC tables.
    fn scan_units<'a>(
        &'a self,
        frame: &Frame,
        header: &[u8],
    ) -> Result<Vec<(Component, &'a Huffman, &'a Huffman)>, ScanDefect> {
        let bad = ScanDefect::Invalid("scan header");
        let count = usize::from(*header.first().ok_or(bad.clone())?);
        (0..count)
            .map(|i| {
                let pair = header.get(1 + 2 * i..3 + 2 * i).ok_or(bad.clone())?;
                let component = *frame
                    .components
                    .iter()
                    .find(|c| c.id == pair[0])
                    .ok_or(bad.clone())?;
                let table = |index: usize| {
                    self.tables
                        .get(index)
                        .and_then(Option::as_ref)
                        .ok_or(ScanDefect::Invalid("scan uses a missing Huffman table"))
                };
                let dc = table(usize::from(pair[1] >> 4))?;
                let ac = table(4 + usize::from(pair[1] & 15))?;
                Ok((component, dc, ac))
            })
            .collect()
    }
}

/// A scan's MCU count and, per MCU, each component's tables and block count (annex A.2: one
/// component alone is walked block by block over its own size).
fn mcu_layout<'a>(
    frame: &Frame,
    units: &[(Component, &'a Huffman, &'a Huffman)],
) -> (usize, Vec<(&'a Huffman, &'a Huffman, usize)>) {
    let (h_max, v_max) = (frame.h_max(), frame.v_max());
    if let [(c, dc, ac)] = units {
        let width = (frame.width * c.h).div_ceil(h_max);
        let height = (frame.height * c.v).div_ceil(v_max);
        return (width.div_ceil(8) * height.div_ceil(8), vec![(*dc, *ac, 1)]);
    }
    let mcus = frame.width.div_ceil(8 * h_max) * frame.height.div_ceil(8 * v_max);
    let per_mcu = units
        .iter()
        .map(|(c, dc, ac)| (*dc, *ac, c.h * c.v))
        .collect();
    (mcus, per_mcu)
}

/// Reads past one block's DC difference and AC coefficients.
fn walk_block(dc: &Huffman, ac: &Huffman, bits: &mut Bits<'_>) -> Result<(), ScanDefect> {
    let size = dc.decode(bits)?;
    bits.skip(size)?;
    let mut k = 1;
    while k < 64 {
        let rs = ac.decode(bits)?;
        let (run, size) = (usize::from(rs >> 4), rs & 15);
        if size == 0 {
            if run != 15 {
                break;
            }
            k += 16;
        } else {
            k += run + 1;
            bits.skip(size)?;
        }
    }
    Ok(())
}

/// The bits of entropy-coded data, stopping at the first marker.
struct Bits<'a> {
    bytes: &'a [u8],
    /// Offset of the next byte to read.
    pos: usize,
    byte: u8,
    left: u8,
}

impl<'a> Bits<'a> {
    fn new(bytes: &'a [u8], pos: usize) -> Self {
        Bits {
            bytes,
            pos,
            byte: 0,
            left: 0,
        }
    }

    fn bit(&mut self) -> Result<i32, ScanDefect> {
        if self.left == 0 {
            self.byte = self.next_byte()?;
            self.left = 8;
        }
        self.left -= 1;
        Ok(i32::from((self.byte >> self.left) & 1))
    }

    fn skip(&mut self, n: u8) -> Result<(), ScanDefect> {
        if n > 16 {
            return Err(ScanDefect::Invalid("coefficient size over 16 bits"));
        }
        for _ in 0..n {
            self.bit()?;
        }
        Ok(())
    }

    /// The next data byte; a marker (or the end of the file) ends the data.
    fn next_byte(&mut self) -> Result<u8, ScanDefect> {
        let byte = *self.bytes.get(self.pos).ok_or(ScanDefect::EndsEarly)?;
        if byte != 0xFF {
            self.pos += 1;
            return Ok(byte);
        }
        match self.bytes.get(self.pos + 1) {
            Some(0x00) => {
                self.pos += 2;
                Ok(0xFF)
            }
            _ => Err(ScanDefect::EndsEarly),
        }
    }

    /// Drops the bits left of the current byte and passes the restart marker that must come
    /// next.
    fn restart(&mut self) -> Result<(), ScanDefect> {
        self.left = 0;
        match next_marker(self.bytes, self.pos) {
            Some((0xD0..=0xD7, after)) => {
                self.pos = after;
                Ok(())
            }
            _ => Err(ScanDefect::EndsEarly),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{DynamicImage, ImageFormat};

    fn jpeg(img: DynamicImage) -> Vec<u8> {
        let mut out = Vec::new();
        img.write_to(&mut std::io::Cursor::new(&mut out), ImageFormat::Jpeg)
            .unwrap();
        out
    }

    /// Photos with detail everywhere, of sizes that are and are not whole MCUs, colour and grey.
    fn photos() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (w, h) in [(256, 192), (17, 9), (1, 1), (333, 101)] {
            let rgb = image::RgbImage::from_fn(w, h, |x, y| {
                let v = (x * 31 + y * 17 + (x * y) % 97) as u8;
                image::Rgb([v, v.wrapping_mul(3), v ^ 0x5a])
            });
            out.push(jpeg(DynamicImage::ImageRgb8(rgb.clone())));
            out.push(jpeg(DynamicImage::ImageRgb8(rgb).grayscale()));
        }
        out
    }

    #[test]
    fn whole_jpegs_pass() {
        for (i, bytes) in photos().iter().enumerate() {
            assert_eq!(check(bytes), Ok(()), "photo {i}");
        }
    }

    #[test]
    fn a_cut_jpeg_with_an_end_marker_appended_ends_early() {
        for (i, whole) in photos().iter().enumerate().filter(|(_, b)| b.len() > 1000) {
            for cut in [whole.len() / 2, whole.len() * 9 / 10] {
                let mut half = whole[..cut].to_vec();
                half.extend_from_slice(&[0xFF, 0xD9]);
                assert_eq!(
                    check(&half),
                    Err(ScanDefect::EndsEarly),
                    "photo {i} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn garbage_is_never_a_panic() {
        let whole = &photos()[0];
        for i in (0..whole.len()).step_by(211) {
            let mut bytes = whole.clone();
            bytes[i] ^= 0xA5;
            let _ = check(&bytes);
            let _ = check(&whole[..i]);
        }
    }
}
