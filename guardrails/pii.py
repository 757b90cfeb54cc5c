"""Personal data and secrets: detection, redaction, reversible pseudonyms.

Structured kinds are found by pattern and then validated, so a number that merely looks right is not
reported: payment cards by Luhn, IBANs by their country's length and mod-97, US SSNs, UK National
Insurance numbers and Spanish DNI/NIE by their published structure. Phones need an international
prefix, a national layout or a phone word nearby. Addresses and person names are cue-based (a
number and a street suffix, the number not an amount and the words between no verbs or pronouns;
"my name is", "Mr.", a signature line) and will miss names said any other way: a model-based check
does better there.

Both checks scan all of the content (redaction must be complete); every pattern is bounded, so the
time is linear in the length. Pure: no Django.
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from guardrails.interface import ALL_LAYERS, CheckContext, CheckResult, Finding, timed

PII_KINDS = ("email", "phone", "card", "iban", "ssn", "nino", "national_id", "address", "person")
STRUCTURED_KINDS = frozenset({"email", "phone", "card", "iban", "ssn", "nino", "national_id"})

# Official IBAN lengths (ISO 13616 registry) for the countries a European/US product meets most.
IBAN_LENGTHS = {
    "AD": 24, "AT": 20, "BA": 20, "BE": 16, "BG": 22, "CH": 21, "CY": 28, "CZ": 24, "DE": 22, "DK": 18,
    "EE": 20, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GI": 23, "GL": 18, "GR": 27, "HR": 21,
    "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27,
    "ME": 22, "MK": 19, "MT": 31, "NL": 18, "NO": 15, "PL": 28, "PT": 25, "RO": 24, "RS": 22, "SA": 24,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TR": 26, "AE": 23, "BR": 29, "QA": 29, "UA": 29,
}  # fmt: skip

_EMAIL = re.compile(r"(?<![\w.%+-])[\w.%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,6}[A-Za-z]{2,24}(?![\w-])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])([A-Z]{2})(\d{2})((?: ?[A-Z0-9]){11,30})")
_SSN = re.compile(r"(?<![\d-])(\d{3})([- ])(\d{2})\2(\d{4})(?![\d-])")
_NINO = re.compile(
    r"(?<![A-Za-z0-9])([A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]) ?(\d{2}) ?(\d{2}) ?(\d{2}) ?([A-D])(?![A-Za-z0-9])"
)
_DNI = re.compile(r"(?<![A-Za-z0-9])([XYZ]?)(\d{7,8})-?([A-Z])(?![A-Za-z0-9])")
_PHONE = re.compile(
    r"(?<![\w+/.-])(?:\+\d{1,3}[ .-]?)?(?:\(0\) ?)?(?:\(\d{1,5}\)[ .-]?)?\d{1,5}(?:[ .-]\d{1,6}){0,5}(?![\w.-]\w)"
)
_PHONE_WORD = re.compile(
    r"(?:phone|tel|telephone|call|mobile|cell|whatsapp|fax|number|ring|text me|sms|t[ée]l[ée]fono|telefon|handy|"
    r"portable|m[óo]vil)\W{0,6}(?:\w+\W+){0,3}$",
    re.IGNORECASE,
)
_US_PHONE = re.compile(r"^(?:\+?1[ .-]?)?\(?\d{3}\)?[ .-]?\d{3}[ .-]\d{4}$")
_DATE_LIKE = re.compile(r"^\d{4}[-.]\d{2}[-.]\d{2}$|^\d{2}[-.]\d{2}[-.]\d{4}$")
_STREET_SUFFIX = (
    r"(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Place|Pl|Terrace|Close|"
    r"Crescent|Square|Sq|Parkway|Pkwy|Highway|Hwy|Row|Gardens|Mews)"
)
_WORD = r"[^\W\d_][^\W\d_'.-]{0,30}"
_ADDRESS = re.compile(
    rf"(?<![\w-])\d{{1,5}}[A-Za-z]?,? (?:(?:{_WORD}) ){{1,4}}{_STREET_SUFFIX}\b\.?"
    rf"|(?<![\w-])\d{{1,4}},? (?:rue|avenue|boulevard|all[ée]e|place|chemin|impasse) (?:(?:de|du|des|la|le|l'|d')\s?)"
    rf"?(?:{_WORD} ?){{1,3}}"
    rf"|\b(?:{_WORD})(?:stra(?:ß|ss)e|weg|gasse|platz|allee) \d{{1,4}}[a-z]?\b"
    rf"|\b(?:calle|avenida|avda\.|plaza|paseo|carrer) (?:(?:de|del|la|las|los) )?(?:{_WORD} ?){{1,3}},? (?:n[º°o]\.? "
    rf"?)?\d{{1,4}}\b",
    re.IGNORECASE,
)
# A number-first match is an address only when it is not an amount ("$12 is on its way") and its words
# could be a street's name: ordinary sentences put verbs and pronouns between a count and "way",
# "drive" or "close"; street names almost never hold them ("The" is kept: "5 The Crescent").
_AMOUNT_BEFORE = re.compile(r"(?:(?:[$€£¥₹]|\b(?:USD|EUR|GBP|CHF|JPY|CAD|AUD))\s?|\d[.,])$", re.IGNORECASE)
_NOT_STREET_WORDS = frozenset(
    {
        "a", "an", "and", "or", "but", "is", "are", "was", "were", "be", "been", "am", "will", "would", "can",
        "could", "should", "may", "might", "must", "has", "have", "had", "do", "does", "did", "not", "no", "on",
        "in", "at", "to", "for", "by", "from", "with", "into", "onto", "out", "off", "over", "per", "than", "then",
        "so", "as", "it", "its", "it's", "this", "that", "these", "those", "they", "their", "there", "we", "our",
        "you", "your", "he", "his", "she", "her", "i", "me", "my", "us", "them", "all", "each", "every", "more",
        "less", "just", "only", "still", "already",
    }
)  # fmt: skip
_QUANTITY_WORDS = frozenset(
    {
        "dollars", "euros", "pounds", "cents", "pence", "bucks", "usd", "eur", "gbp", "percent", "seconds",
        "minutes", "mins", "hours", "hrs", "days", "weeks", "months", "years", "times", "items", "units",
        "people", "orders", "tickets", "miles", "kilometres", "kilometers", "metres", "meters", "feet", "km",
    }
)  # fmt: skip
_NAME = r"(?:[^\W\d_][^\W\d_'’-]{1,30})(?: (?:[^\W\d_][^\W\d_'’-]{1,30})){0,2}"
_PERSON_CUES = [
    re.compile(
        r"\b(?:my name is|my name's|i am called|je m'appelle|me llamo|mi nombre es|ich hei(?:ß|ss)e|mein name ist) ("
        rf"{_NAME})",
        re.IGNORECASE,
    ),
    re.compile(rf"\b(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sr|Sra|Mme|M|Herr|Frau)\.? ({_NAME})"),
    re.compile(
        r"(?:regards|thanks|thank you|cheers|sincerely|best|cordialement|saludos|gr[üu](?:ß|ss)e),?[ \t]*\n[ \t]*("
        rf"{_NAME})[ \t]*(?:\n|$)",
        re.IGNORECASE,
    ),
]
_STOP_NAMES = frozenset(
    {"the", "a", "an", "and", "i", "you", "we", "team", "support", "customer", "service", "sir", "madam"}
)

_SECRET_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("aws_access_key", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("openai_key", re.compile(r"(?<![\w-])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,200}(?![\w-])")),
    ("anthropic_key", re.compile(r"(?<![\w-])sk-ant-[A-Za-z0-9_-]{20,200}(?![\w-])")),
    ("github_token", re.compile(r"(?<!\w)(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,255})(?!\w)")),
    ("gitlab_token", re.compile(r"(?<!\w)glpat-[A-Za-z0-9_-]{20,}(?!\w)")),
    ("slack_token", re.compile(r"(?<!\w)xox[abprs]-[A-Za-z0-9-]{10,200}(?!\w)")),
    ("slack_webhook", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,120}")),
    ("stripe_key", re.compile(r"(?<!\w)(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,100}(?!\w)")),
    ("google_api_key", re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])")),
    (
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY(?: BLOCK)?-----[\s\S]{0,8000}?-----END (?:[A-Z0-9]+ )?PRIVATE KE"
            r"Y(?: BLOCK)?-----"
        ),
    ),
    ("private_key_header", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY(?: BLOCK)?-----")),
    (
        "jwt",
        re.compile(r"(?<![\w-])eyJ[A-Za-z0-9_-]{8,2000}\.eyJ[A-Za-z0-9_-]{8,4000}\.[A-Za-z0-9_-]{8,2000}(?![\w-])"),
    ),
    (
        "url_credentials",
        re.compile(r"\b[a-z][a-z0-9+.-]{1,20}://[^\s:/@]{1,64}:[^\s:/@]{3,128}@[\w.-]{1,200}", re.IGNORECASE),
    ),
]
_KEYWORD_SECRET = re.compile(
    r"(?i)\b(?:api[_-]?key|apikey|secret(?:[_-]?key)?|token|access[_-]?key|auth[_-]?token|password|passwd|pwd|"
    r"client[_-]?secret|bearer|credentials?)\b[\"']?\s*(?::|=|=>|\bis\b)?\s*[\"']?([A-Za-z0-9_+/=.~-]{16,200})"
)
MIN_SECRET_ENTROPY = 3.3  # bits per character; English words score about 2.5-3, random tokens 4+


@dataclass(frozen=True, slots=True)
class Detection:
    kind: str
    start: int
    end: int
    text: str


# ---------------------------------------------------------------------------------------------- validators


def luhn_valid(number: str) -> bool:
    """Whether a digit string passes the Luhn checksum (payment cards, 13-19 digits)."""
    digits = [int(ch) for ch in number if ch.isdigit()]
    if not 13 <= len(digits) <= 19 or len(set(digits)) == 1:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2 == 1:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """Whether an IBAN (spaces allowed) has its country's length and passes ISO 7064 mod-97."""
    compact = iban.replace(" ", "").upper()
    if len(compact) < 15 or not compact[:2].isalpha() or not compact[2:4].isdigit() or not compact.isalnum():
        return False
    expected = IBAN_LENGTHS.get(compact[:2])
    if expected is not None and len(compact) != expected:
        return False
    rearranged = compact[4:] + compact[:4]
    numeric = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(numeric) % 97 == 1


def ssn_valid(area: str, group: str, serial: str) -> bool:
    return area not in {"000", "666"} and not area.startswith("9") and group != "00" and serial != "0000"


def dni_valid(prefix: str, digits: str, letter: str) -> bool:
    """Spanish DNI (8 digits) or NIE (X/Y/Z + 7 digits): the letter is the number mod 23."""
    if prefix:
        if len(digits) != 7:
            return False
        number = int(str("XYZ".index(prefix)) + digits)
    else:
        if len(digits) != 8:
            return False
        number = int(digits)
    return "TRWAGMYFPDXBNJZSQVHLCKE"[number % 23] == letter


def shannon_entropy(text: str) -> float:
    if not text:
        return 0.0
    counts: dict[str, int] = {}
    for ch in text:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


# ---------------------------------------------------------------------------------------------- detection


def _phone_accepted(content: str, start: int, value: str) -> bool:
    digits = sum(ch.isdigit() for ch in value)
    if not 8 <= digits <= 15 or _DATE_LIKE.match(value):
        return False
    groups = re.findall(r"\d+", value)
    if value.startswith("+"):
        # After the country code one short trunk digit is normal (+33 6 ..., +44 7...); after that, groups.
        return all(len(g) >= 2 for g in groups[2:])
    if _US_PHONE.match(value):
        return True
    if value.startswith(("0", "(0")) and 10 <= digits <= 12 and all(len(g) >= 2 for g in groups):
        return True
    before = content[max(0, start - 40) : start]
    return _PHONE_WORD.search(before) is not None and all(len(g) >= 2 for g in groups)


def _address_accepted(content: str, start: int, value: str) -> bool:
    if not value[:1].isdigit():
        return True  # "Hauptstraße 5", "Calle Mayor 12": the street word itself is the cue
    if _AMOUNT_BEFORE.search(content[max(0, start - 5) : start]):
        return False
    words = [word.strip(",.").casefold() for word in value.split()[1:]]
    return bool(words) and words[0] not in _QUANTITY_WORDS and _NOT_STREET_WORDS.isdisjoint(words)


def _iban_detection(content: str, found: re.Match[str]) -> Detection | None:
    country = found.group(1)
    expected = IBAN_LENGTHS.get(country)
    if expected is None:
        return None
    # The pattern may run on into the next word; keep exactly the country's length of characters.
    need = expected - 4
    end = found.start(3)
    taken = 0
    while end < found.end() and taken < need:
        if content[end] != " ":
            taken += 1
        end += 1
    if taken != need:
        return None
    text = content[found.start() : end]
    if not iban_valid(text):
        return None
    return Detection("iban", found.start(), end, text)


def pii_detect(content: str, kinds: Iterable[str] | None = None) -> list[Detection]:
    """Validated PII in `content`, without overlaps (the more specific kind wins), in text order."""
    wanted = frozenset(PII_KINDS if kinds is None else kinds)
    found: list[Detection] = []
    if "email" in wanted and "@" in content:
        found += [Detection("email", m.start(), m.end(), m.group()) for m in _EMAIL.finditer(content)]
    if "iban" in wanted:
        for m in _IBAN.finditer(content):
            detection = _iban_detection(content, m)
            if detection:
                found.append(detection)
    if "card" in wanted:
        for m in _CARD.finditer(content):
            value = m.group().rstrip(" -")
            if luhn_valid(value):
                found.append(Detection("card", m.start(), m.start() + len(value), value))
    if "ssn" in wanted:
        for m in _SSN.finditer(content):
            if ssn_valid(m.group(1), m.group(3), m.group(4)) and (
                m.group(2) == "-" or re.search(r"(?i)ssn|social security", content[max(0, m.start() - 40) : m.start()])
            ):
                found.append(Detection("ssn", m.start(), m.end(), m.group()))
    if "nino" in wanted:
        for m in _NINO.finditer(content):
            if m.group(1) not in {"BG", "GB", "NK", "KN", "TN", "NT", "ZZ"}:
                found.append(Detection("nino", m.start(), m.end(), m.group()))
    if "national_id" in wanted:
        for m in _DNI.finditer(content):
            if dni_valid(m.group(1), m.group(2), m.group(3)):
                found.append(Detection("national_id", m.start(), m.end(), m.group()))
    if "phone" in wanted:
        for m in _PHONE.finditer(content):
            value = m.group().rstrip(" .-")
            if _phone_accepted(content, m.start(), value):
                found.append(Detection("phone", m.start(), m.start() + len(value), value))
    if "address" in wanted:
        found += [
            Detection("address", m.start(), m.end(), m.group().rstrip(" ,"))
            for m in _ADDRESS.finditer(content)
            if _address_accepted(content, m.start(), m.group())
        ]
    if "person" in wanted:
        for pattern in _PERSON_CUES:
            for m in pattern.finditer(content):
                name = _trim_name(m.group(1))
                if name:
                    found.append(Detection("person", m.start(1), m.start(1) + len(name), name))
    return _without_overlaps(found)


def _trim_name(candidate: str) -> str:
    """Keep the leading capitalised words of a name candidate ("John Smith and I" -> "John Smith")."""
    kept: list[str] = []
    for word in candidate.split(" "):
        if not word[:1].isupper() or word.casefold() in _STOP_NAMES:
            break
        kept.append(word)
    return " ".join(kept)


_PRIORITY = {
    kind: rank
    for rank, kind in enumerate(
        ("private_key", "card", "iban", "email", "ssn", "nino", "national_id", "phone", "address", "person")
    )
}


def _without_overlaps(found: list[Detection]) -> list[Detection]:
    """The detections that win where they overlap (by kind priority, then length), in text order."""
    ordered = sorted(found, key=lambda d: (_PRIORITY.get(d.kind, 0), -(d.end - d.start), d.start))
    # The kept spans never overlap, so in start order their ends are ordered too: a new span can only
    # collide with its neighbours there. Bisecting keeps the whole pass n log n instead of n².
    starts: list[int] = []
    kept: list[Detection] = []
    for detection in ordered:
        index = bisect.bisect_left(starts, detection.start)
        before = kept[index - 1] if index else None
        after = kept[index] if index < len(kept) else None
        if (before is None or before.end <= detection.start) and (after is None or detection.end <= after.start):
            starts.insert(index, detection.start)
            kept.insert(index, detection)
    return kept


def secrets_detect(content: str) -> list[Detection]:
    """API keys, tokens, private keys, JWTs, and high-entropy values next to key-like words."""
    found: list[Detection] = []
    for kind, pattern in _SECRET_PATTERNS:
        found += [Detection(kind, m.start(), m.end(), m.group()) for m in pattern.finditer(content)]
    for m in _KEYWORD_SECRET.finditer(content):
        value = m.group(1)
        has_digit = any(ch.isdigit() for ch in value)
        if shannon_entropy(value) >= MIN_SECRET_ENTROPY and has_digit:
            found.append(Detection("generic_secret", m.start(1), m.end(1), value))
    return _without_overlaps(found)


# ---------------------------------------------------------------------------------------------- pseudonyms


def _canonical(kind: str, text: str) -> str:
    if kind in STRUCTURED_KINDS and kind != "email":
        return re.sub(r"[\s().-]", "", text).upper()
    return text.casefold().strip()


def pseudonym_for(kind: str, text: str, key: str) -> str:
    """A stable token for one value: the same value, kind and key always give the same token, and the
    token reveals nothing without the key (HMAC-SHA256, first 8 hex digits)."""
    digest = hmac.new(key.encode(), f"{kind}\x00{_canonical(kind, text)}".encode(), hashlib.sha256).hexdigest()
    return f"«{kind.upper()}_{digest[:8]}»"


def redact(
    content: str, detections: Iterable[Detection], *, pseudonym_key: str | None = None
) -> tuple[str, dict[str, str]]:
    """Content with each detection replaced by `[KIND]`, or by a pseudonym when a key is given;
    returns the text and the pseudonym mapping (token -> original; empty without a key)."""
    parts: list[str] = []
    mapping: dict[str, str] = {}
    position = 0
    for detection in sorted(detections, key=lambda d: d.start):
        if detection.start < position:
            continue
        parts.append(content[position : detection.start])
        if pseudonym_key is None:
            parts.append(f"[{detection.kind.upper()}]")
        else:
            token = pseudonym_for(detection.kind, detection.text, pseudonym_key)
            mapping.setdefault(token, detection.text)
            parts.append(token)
        position = detection.end
    parts.append(content[position:])
    return "".join(parts), mapping


def pii_pseudonymize(content: str, key: str, kinds: Iterable[str] | None = None) -> tuple[str, dict[str, str]]:
    """Replace PII with reversible pseudonyms; keep the mapping (token -> original) to restore the
    model's answer with `pseudonyms_restore`, server-side, never in the prompt."""
    return redact(content, pii_detect(content, kinds), pseudonym_key=key)


_TOKEN = re.compile(r"«[A-Z_]{2,20}_[0-9a-f]{8}»")


def pseudonyms_restore(text: str, mapping: Mapping[str, str]) -> str:
    """Put the originals back for every known token in `text`; unknown tokens stay as they are."""
    return _TOKEN.sub(lambda m: mapping.get(m.group(), m.group()), text)


# ---------------------------------------------------------------------------------------------- checks


def _findings(detections: Iterable[Detection]) -> tuple[Finding, ...]:
    return tuple(Finding(d.kind, d.start, d.end, d.text) for d in detections)


def _summary(detections: list[Detection]) -> str:
    counts: dict[str, int] = {}
    for detection in detections:
        counts[detection.kind] = counts.get(detection.kind, 0) + 1
    return ", ".join(f"{kind} ×{count}" for kind, count in sorted(counts.items()))


class PiiCheck:
    """Personal data; `redacted` holds the content with `[EMAIL]`-style labels or pseudonyms."""

    name = "pii"
    layers = ALL_LAYERS

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            detections = pii_detect(content, context.pii_kinds)
            if not detections:
                return CheckResult(self.name, False, 0.0, "no personal data found", 0.0)
            key = context.pseudonym_key if context.pseudonymize else None
            redacted, _ = redact(content, detections, pseudonym_key=key)
            return CheckResult(self.name, True, 1.0, _summary(detections), 0.0, redacted, _findings(detections))

        return timed(self.name, body)


class SecretsCheck:
    """Credentials: provider API keys and tokens, private keys, JWTs, high-entropy values after key words."""

    name = "secrets"
    layers = ALL_LAYERS

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            detections = secrets_detect(content)
            if not detections:
                return CheckResult(self.name, False, 0.0, "no secrets found", 0.0)
            redacted, _ = redact(content, [Detection("secret", d.start, d.end, d.text) for d in detections])
            return CheckResult(self.name, True, 1.0, _summary(detections), 0.0, redacted, _findings(detections))

        return timed(self.name, body)
