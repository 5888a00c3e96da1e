//! The one font plots use, embedded in the binary.
//!
//! plotters' `ab_glyph` backend never looks at system fonts (no fontconfig, no font
//! directories): text is drawn only with fonts registered here. meshsim embeds DejaVu Sans
//! (`assets/fonts/DejaVuSans.ttf`, licence in `assets/fonts/LICENSE-DejaVu.txt`) so that
//! plots look the same on every machine, including fresh containers without any font.

use std::sync::OnceLock;

use plotters::style::FontStyle;

/// DejaVu Sans 2.37 (Bitstream Vera licence; see `assets/fonts/LICENSE-DejaVu.txt`).
static DEJAVU_SANS: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

/// The family name charts ask for; registered for every style (bold falls back to normal).
pub(crate) const FAMILY: &str = "sans-serif";

/// Registers the embedded font with plotters once per process. Returns false if the embedded
/// file is not a valid font (a broken build), in which case charts cannot draw text.
pub(crate) fn ensure_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        [FontStyle::Normal, FontStyle::Bold]
            .into_iter()
            .all(|style| plotters::style::register_font(FAMILY, style, DEJAVU_SANS).is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_font_registers() {
        assert!(ensure_registered());
        assert!(ensure_registered(), "registering twice is harmless");
    }
}
