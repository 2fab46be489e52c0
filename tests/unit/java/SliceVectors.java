/*
 * Test vectors for journal/slices.py: Java's String.hashCode and Pekko's slice.
 *
 * Regenerate (from the repository root):
 *
 *   javac -d /tmp/sv tests/unit/java/SliceVectors.java && java -cp /tmp/sv SliceVectors > tests/unit/data/slice_vectors.tsv
 *
 * Output: one line per test string, tab separated:
 *
 *   <hex of the UTF-8 bytes of the string>\t<String.hashCode()>\t<Math.abs(s.hashCode() % 1024)>
 *
 * The last column is exactly how Apache Pekko Persistence computes the slice of a
 * persistence id (Persistence.sliceForPersistenceId with numberOfSlices = 1024).
 * Strings are hex encoded so that tabs, newlines or NULs inside them cannot break
 * the format. The output is deterministic (fixed seeds, no hash-ordered collections);
 * every string is valid Unicode (no lone surrogates), which is checked before printing.
 *
 * This source is pure ASCII (non-ASCII characters are written as Unicode escapes) so that
 * javac reads it the same way whatever the platform's default encoding is.
 */

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

public final class SliceVectors {

    private static final int NUMBER_OF_SLICES = 1024;

    private static final String[] ENTITY_TYPES = {
        "Account", "ShoppingCart", "Order", "user", "a", "V\u00E9hicule", "Benutzerkonto",
        "\u6CE8\u6587", "\u0421\u0447\u0451\u0442", "\uD83D\uDE80Rocket", "X-Y_z.9",
    };

    private SliceVectors() {}

    public static void main(String[] args) {
        List<String> strings = new ArrayList<>();

        asciiIds(strings);
        fixedSamples(strings);
        pipes(strings);
        longStrings(strings);
        minValueStrings(strings);
        randomStrings(strings);

        StringBuilder out = new StringBuilder(1 << 20);
        for (String s : strings) {
            checkValid(s);
            int h = s.hashCode();
            out.append(hex(s.getBytes(StandardCharsets.UTF_8)))
                .append('\t')
                .append(h)
                .append('\t')
                .append(Math.abs(h % NUMBER_OF_SLICES))
                .append('\n');
        }
        System.out.print(out);
        System.out.flush();
    }

    /** Typical persistence ids: "Type|id" with numeric, UUID-like and word ids. */
    private static void asciiIds(List<String> strings) {
        strings.add("Account|123");
        strings.add("Account|1");
        strings.add("Account|0");
        strings.add("ShoppingCart|cart-42");
        strings.add("Order|2024-01-01T00:00:00Z");
        for (int i = 0; i < 300; i++) {
            strings.add("Account|" + i);
        }
        for (int i = 0; i < 100; i++) {
            strings.add("Order|" + (1_000_000_007L * i));
        }
        Random r = new Random(0x5EED_0001L);
        for (int i = 0; i < 100; i++) {
            String type = ENTITY_TYPES[r.nextInt(ENTITY_TYPES.length)];
            strings.add(type + "|" + new java.util.UUID(r.nextLong(), r.nextLong()));
        }
        for (int i = 0; i < 50; i++) {
            strings.add("user|user-" + Integer.toHexString(r.nextInt()));
        }
        // Single characters and tiny strings, including the empty string.
        strings.add("");
        for (char c = 0x20; c < 0x7f; c++) {
            strings.add(String.valueOf(c));
        }
        strings.add("Aa");
        strings.add("BB"); // same hashCode as "Aa"
    }

    /** Hand-picked non-ASCII and edge-case strings. */
    private static void fixedSamples(List<String> strings) {
        String[] samples = {
            // accented Latin
            "\u00E9", "\u00F1", "\u00FC", "\u00DF", "\u00D8", // e-acute n-tilde u-umlaut sz O-slash
            "Caf\u00E9|cr\u00E8me-br\u00FBl\u00E9e",
            "Se\u00F1or|Mu\u00F1oz",
            "\u00DCber|Gr\u00FC\u00DFe",
            "Account|Jos\u00E9",
            "na\u00EFve|fa\u00E7ade",
            "\u00C5ngstr\u00F6m|\u00F8re",
            "\u0152uvre|\u0153il",
            "\u0141\u00F3d\u017A|\u017Di\u017Ekov",
            "e\u0301", // e + combining acute (not normalised)
            // Greek, Cyrillic, Hebrew, Arabic (with Arabic-Indic digits), Devanagari, Thai
            "\u039B\u03BF\u03B3\u03B1\u03C1\u03B9\u03B1\u03C3\u03BC\u03CC\u03C2|42",
            "\u0421\u0447\u0451\u0442|\u043D\u043E\u043C\u0435\u0440-7",
            "\u05D7\u05E9\u05D1\u05D5\u05DF|5",
            "\u062D\u0633\u0627\u0628|\u0663\u0664",
            "\u0916\u093E\u0924\u093E|\u0967\u0968\u0969",
            "\u0E1A\u0E31\u0E0D\u0E0A\u0E35|9",
            // CJK, kana, Hangul
            "\u4E2D",
            "\u6CE8\u6587|12345",
            "\u7528\u6237|\u5F20\u4E09",
            "\u30A2\u30AB\u30A6\u30F3\u30C8|\u30AB\u30BF\u30AB\u30CA",
            "\u3072\u3089\u304C\u306A|\u30C6\u30B9\u30C8",
            "\uACC4\uC815|\uD64D\uAE38\uB3D9",
            "\u6F22\u5B57\u304B\u306A\u4EA4\u3058\u308A\u6587|\u6DF7\u5408",
            // emoji and other astral characters (surrogate pairs)
            "\uD83D\uDE00", // U+1F600 GRINNING FACE
            "\uD834\uDD1E", // U+1D11E MUSICAL SYMBOL G CLEF
            "\uD840\uDC00", // U+20000 CJK EXTENSION B
            "\uDBFF\uDFFF", // U+10FFFF last code point
            "\uD800\uDC00", // U+10000 first astral code point
            "Emoji|\uD83D\uDE00\uD83D\uDE01\uD83D\uDE02",
            "\uD83D\uDE80Rocket|launch-\uD83C\uDF0D", // U+1F680 rocket, U+1F30D globe
            // family: man ZWJ woman ZWJ girl ZWJ boy
            "Family|\uD83D\uDC68\u200D\uD83D\uDC69\u200D\uD83D\uDC67\u200D\uD83D\uDC66",
            "Flag|\uD83C\uDDE9\uD83C\uDDEA\uD83C\uDDEF\uD83C\uDDF5", // regional indicators
            "Music|\uD834\uDD1E\uD834\uDD22",
            "Cjk|\uD840\uDC00\uD840\uDC01\uD869\uDEA5",
            "Thumbs|\uD83D\uDC4D\uD83C\uDFFD",
            // mixed
            "Mixed|abc-\u00E9-\u4E2D-\uD83D\uDE00-\uD834\uDD1E-\uD840\uDC00-z",
            "\u03A9mega|\u03B11\u03B22\u03B33",
            "Account|123\u00E9",
            "\uD83D\uDE00|\uD83D\uDE00",
            // special BMP characters that are valid Unicode scalar values
            "\u00A0", "\u200B", "\u200D", "\uFEFF", "\uFFFD", "\uFFFE", "\uFFFF", "\uE000",
            "\uF8FF", "\u0080", "\u07FF", "\u0800", "\uD7FF",
            // control characters: not valid ids, but hashCode/slice are still defined
            "\u0000", "\t", "\n", "\r\n", "tab\there", "line\nbreak", "nul\u0000inside",
            "\u001F", "\u007F",
            // whitespace
            " ", "  ", "Account| 1", " Account|1", "Account|1 ",
        };
        for (String s : samples) {
            strings.add(s);
        }
        // Every code point in a few interesting blocks, as "T|<c>".
        int[][] ranges = {
            {0x00C0, 0x00FF}, {0x0100, 0x017F}, {0x4E00, 0x4E3F}, {0x1F600, 0x1F64F},
            {0x1D100, 0x1D12F}, {0x20000, 0x2001F}, {0x10FFE0, 0x10FFFF},
        };
        for (int[] range : ranges) {
            for (int cp = range[0]; cp <= range[1]; cp++) {
                strings.add("T|" + new String(Character.toChars(cp)));
            }
        }
    }

    /** "Empty after pipe", lone and repeated pipes. */
    private static void pipes(List<String> strings) {
        for (String type : ENTITY_TYPES) {
            strings.add(type + "|");
            strings.add(type + "||");
            strings.add(type + "|a|b");
        }
        String[] samples = {
            "|", "||", "|||", "|a", "a|", "|Account|1", "Account||1", "Account|1|",
            "| |", "|\u00E9|", "|\uD83D\uDE00|", "a|b|c|d|e|f", "||||||||||||||||||||||||||||||||",
        };
        for (String s : samples) {
            strings.add(s);
        }
    }

    /** Long strings: around the 255 char limit and several thousand chars. */
    private static void longStrings(List<String> strings) {
        for (int len : new int[] {254, 255, 256}) {
            strings.add("A".repeat(len));
            strings.add("Account|" + "9".repeat(len - 8));
            strings.add("\u00E9".repeat(len));
            strings.add("\u4E2D".repeat(len));
        }
        // 255 UTF-16 code units with a surrogate pair at the end (127 pairs + 1 char)
        strings.add("x" + "\uD83D\uDE00".repeat(127));
        strings.add("Account|" + "0123456789".repeat(500)); // 5008 chars
        strings.add("z".repeat(4096));
        strings.add("\u00E9\u4E2D\uD83D\uDE00|".repeat(1500)); // 7500 chars
        strings.add("\uD834\uDD1E".repeat(3000)); // 6000 UTF-16 code units
        Random r = new Random(0x5EED_0002L);
        for (int len : new int[] {1000, 2500, 8000}) {
            strings.add(randomString(r, len, len));
        }
    }

    /**
     * Strings whose hashCode is Integer.MIN_VALUE (where Math.abs is a no-op). A few are
     * well known; more are constructed as "Account|<n>" + two printable ASCII characters,
     * solving 31 * c1 + c2 == MIN_VALUE - 31^2 * hash(prefix) (mod 2^32).
     */
    private static void minValueStrings(List<String> strings) {
        strings.add("polygenelubricants");
        strings.add("GydZG_");
        strings.add("DESIGNING WORKHOUSES");
        strings.add("\u0000\u0000polygenelubricants"); // leading NULs do not change the hash
        int found = 0;
        for (long n = 0; found < 8 && n < 100_000_000L; n++) {
            String prefix = "Account|" + n;
            int remainder = Integer.MIN_VALUE - 31 * 31 * prefix.hashCode();
            for (int c1 = 0x21; c1 < 0x7f; c1++) {
                int c2 = remainder - 31 * c1;
                if (c2 >= 0x21 && c2 < 0x7f && c1 != '|' && c2 != '|') {
                    strings.add(prefix + (char) c1 + (char) c2);
                    found++;
                    break;
                }
            }
        }
        for (int i = strings.size() - found - 4; i < strings.size(); i++) {
            if (strings.get(i).hashCode() != Integer.MIN_VALUE) {
                throw new IllegalStateException("not a MIN_VALUE string: " + strings.get(i));
            }
        }
    }

    /** Pseudo-random strings over several Unicode ranges, from fixed seeds. */
    private static void randomStrings(List<String> strings) {
        Random r = new Random(0x5EED_0003L);
        for (int i = 0; i < 1500; i++) {
            strings.add(randomString(r, 0, 40));
        }
        for (int i = 0; i < 300; i++) {
            String type = ENTITY_TYPES[r.nextInt(ENTITY_TYPES.length)];
            strings.add(type + "|" + randomString(r, 1, 30));
        }
    }

    // {first, last} code points; one range is picked per character.
    private static final int[][] RANDOM_RANGES = {
        {0x0020, 0x007E}, // printable ASCII
        {0x0000, 0x007F}, // all ASCII including control characters
        {0x00A0, 0x024F}, // Latin-1 supplement, Latin extended A/B
        {0x0370, 0x04FF}, // Greek, Cyrillic
        {0x0600, 0x06FF}, // Arabic
        {0x3040, 0x30FF}, // Hiragana, Katakana
        {0x4E00, 0x9FFF}, // CJK unified ideographs
        {0xAC00, 0xD7A3}, // Hangul syllables
        {0x0000, 0xD7FF}, // BMP below the surrogates
        {0xE000, 0xFFFF}, // BMP above the surrogates
        {0x1F300, 0x1FAFF}, // emoji
        {0x1D400, 0x1D7FF}, // mathematical alphanumerics
        {0x20000, 0x2A6DF}, // CJK extension B
        {0x10000, 0x10FFFF}, // all supplementary planes
    };

    /**
     * A random string of minLength..maxLength UTF-16 code units (one more if it ends with a
     * surrogate pair), over one or two random ranges or a mix of all of them.
     */
    private static String randomString(Random r, int minLength, int maxLength) {
        int length = minLength + r.nextInt(maxLength - minLength + 1);
        // Most strings stick to one or two ranges, some mix all of them.
        int[] a = RANDOM_RANGES[r.nextInt(RANDOM_RANGES.length)];
        int[] b = RANDOM_RANGES[r.nextInt(RANDOM_RANGES.length)];
        boolean mixAll = r.nextInt(4) == 0;
        StringBuilder sb = new StringBuilder(length);
        while (sb.length() < length) {
            int[] range = mixAll ? RANDOM_RANGES[r.nextInt(RANDOM_RANGES.length)]
                : (r.nextBoolean() ? a : b);
            int cp = range[0] + r.nextInt(range[1] - range[0] + 1);
            if (cp <= 0xFFFF && Character.isSurrogate((char) cp)) {
                continue; // never produce a lone surrogate
            }
            sb.appendCodePoint(cp);
        }
        return sb.toString();
    }

    /** Reject lone surrogates: the UTF-8 bytes must decode back to the same string. */
    private static void checkValid(String s) {
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c)) {
                if (i + 1 >= s.length() || !Character.isLowSurrogate(s.charAt(i + 1))) {
                    throw new IllegalStateException("lone high surrogate at " + i);
                }
                i++;
            } else if (Character.isLowSurrogate(c)) {
                throw new IllegalStateException("lone low surrogate at " + i);
            }
        }
        byte[] utf8 = s.getBytes(StandardCharsets.UTF_8);
        if (!new String(utf8, StandardCharsets.UTF_8).equals(s)) {
            throw new IllegalStateException("UTF-8 round trip failed");
        }
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private static String hex(byte[] bytes) {
        char[] chars = new char[bytes.length * 2];
        for (int i = 0; i < bytes.length; i++) {
            chars[2 * i] = HEX[(bytes[i] >> 4) & 0xF];
            chars[2 * i + 1] = HEX[bytes[i] & 0xF];
        }
        return new String(chars);
    }
}
