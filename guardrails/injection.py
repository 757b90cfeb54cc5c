"""Prompt injection: direct (user messages, jailbreaks) and indirect (instructions hidden in data).

Both checks score text with weighted cues combined as a noisy-or (`interface.combine`) and trigger
at THRESHOLD. The cues are structural (a verb of dismissal followed by a noun for the model's
instructions; an imperative addressed to an AI; hidden markup carrying instructions; links that
carry data out), not a list of known attack strings, so paraphrases still hit. Quoting is the main
source of false positives (a user asking what "ignore previous instructions" means, an article
about attacks), so a cue inside quotes next to a question or discussion marker counts for little.

Encoded payloads (base64, hex, rot13) are decoded and scored again. Pure: no Django.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import re
from dataclasses import dataclass

from guardrails.interface import (
    ALL_LAYERS,
    INPUT_LAYERS,
    CheckContext,
    CheckResult,
    Layer,
    combine,
    normalize,
    scan_window,
    timed,
)

THRESHOLD = 0.5
# A decoded payload at most this long is scored; longer blobs are data (images, archives), not prompts.
MAX_DECODED = 4_000
MAX_ENCODED_RUNS = 8

_F = re.IGNORECASE

# The words around instructions, in English. Kept broad on purpose: each adds little on its own.
_DISMISS = (
    r"(?:ignore|ignoring|disregard|forget|skip|override|overrule|bypass|circumvent|set aside|throw (?:away|out)|"
    r"pay no (?:attention|heed) to|stop (?:following|obeying)|do not (?:follow|obey|apply)|don'?t (?:follow|obey|app"
    r"ly)|"
    r"discard|abandon|neglect|drop|erase|delete|cancel|nullify|void|remove)"
)
_PRIOR = r"(?:previous|prior|earlier|above|preceding|original|initial|old|existing|current|former|given|all|any)"
_INSTRUCTION_NOUN = (
    r"(?:instructions?|rules?|directions?|guidelines?|prompts?|constraints?|system (?:message|prompt)s?|commands?|"
    r"guidance|restrictions?|directives?|programming|polic(?:y|ies)|filters?|safety (?:rules|guidelines|measures)|"
    r"ethic(?:s|al guidelines)|training|orders|limitations?|settings|configuration)"
)
_AI = (
    r"(?:ai|a\.i\.|assistant|language model|llm|model|chatbot|chat bot|bot|agent|gpt|chatgpt|claude|gemini|copilot|"
    r"automated system|ai system|system)"
)
_GAP = r"(?:\W+\w+){0,5}?\W+"

_DIRECT_CUES: list[tuple[str, float, re.Pattern[str]]] = [
    # "ignore all previous instructions", "disregard your rules", "forget the guidelines above"
    ("override", 0.6, re.compile(rf"\b{_DISMISS}{_GAP}{_INSTRUCTION_NOUN}\b", _F)),
    ("override_prior", 0.45, re.compile(rf"\b{_DISMISS}(?:\W+\w+){{0,3}}?\W+{_PRIOR}\b", _F)),
    (
        "override_everything",
        0.6,
        re.compile(
            # Not "forget what I said before": a customer taking back their own words, not the model's orders.
            rf"\b{_DISMISS}\W+(?:everything|all(?: of)? (?:that|this|it)|what(?:ever)?)\W+(?!(?:I|we)\b)"
            r"(?:\w+\W+){0,4}?(?:before|above|earlier|previously|you were (?:told|given))",
            _F,
        ),
    ),
    (
        "rules_never_existed",
        0.7,
        re.compile(
            rf"\b(?:pretend|imagine|act as if|assume)\b.{{0,60}}\b{_INSTRUCTION_NOUN}\b.{{0,40}}"
            r"(?:never existed|don'?t exist|do not exist|no longer apply|are void|are gone)",
            _F,
        ),
    ),
    (
        "new_instructions",
        0.45,
        re.compile(
            r"\b(?:new|updated|real|actual|true) (?:rules?|instructions?|task|directives?|orders|policy)\s*(?::|are|"
            r"is)|"
            r"\byour (?:instructions|rules|guidelines|policy) (?:have|has) (?:been )?(?:changed|updated|replaced|lif"
            r"ted)|"
            rf"\b(?:{_PRIOR} )?(?:instructions|rules|guidelines) (?:above |before this )?(?:are|is) (?:now )?(?:void|"
            r"cancelled|canceled|obsolete|fake|revoked|null|lifted)",
            _F,
        ),
    ),
    (
        "from_now_on",
        0.25,
        re.compile(r"\b(?:from now on|for the rest of (?:this|the) (?:chat|conversation)|henceforth)\b", _F),
    ),
    (
        "no_restrictions",
        0.55,
        re.compile(
            r"\b(?:without|no|free (?:of|from)|not bound by|broken? free of|unbound by|ignores?)\W+(?:any\W+)?"
            r"(?:\w+\W+){0,2}?(?:restrictions?|filters?|limitations?|censorship|content polic(?:y|ies)|"
            r"ethical (?:guidelines|rules|constraints)|moral(?:s| (?:guidelines|rules))|safety (?:rules|guidelines)|"
            r"refusals?|warnings or disclaimers|rules)\b",
            _F,
        ),
    ),
    (
        "unfiltered_ai",
        0.5,
        re.compile(rf"\b(?:unfiltered|unrestricted|uncensored|jailbroken|amoral)\W+(?:\w+\W+)?{_AI}\b", _F),
    ),
    (
        "do_anything_now",
        0.8,
        re.compile(r"\bdo anything now\b|\bjailbreak(?:ed)? mode\b|\bdeveloper mode\b|\bgod mode\b", _F),
    ),
    (
        "persona_switch",
        0.35,
        re.compile(
            r"\b(?:you are|you're|act as|pretend (?:to be|you are)|role of)\W+(?:now\W+)?(?:dan|stan|dude|aim)\b", _F
        ),
    ),
    (
        "never_refuse",
        0.45,
        re.compile(
            r"\b(?:never|not|don'?t|do not|cannot|can'?t) (?:ever )?(?:refuse|decline|say no)\b|\bno refusals?\b", _F
        ),
    ),
    (
        "not_bound",
        0.55,
        re.compile(
            r"\b(?:not|never|no longer|doesn'?t|does not|don'?t|do not|won'?t|need not)\W+(?:\w+\W+)?"
            r"(?:(?:have|need) to\W+)?(?:abide by|be bound by|bound by|follow|obey|comply with|adhere to)\W+"
            r"(?:\w+\W+){0,6}?(?:rules|polic(?:y|ies)|guidelines|restrictions|laws|ethics|terms)\b",
            _F,
        ),
    ),
    ("immerse_role", 0.3, re.compile(r"\bimmerse yourself\b|\bfully (?:embody|become)\b", _F)),
    (
        "free_entity",
        0.4,
        re.compile(
            r"\bbroken free\b|\bfree (?:entity|ai|being)\b|\bconfines of (?:ai|your (?:programming|rules))\b", _F
        ),
    ),
    (
        "other_ai_persona",
        0.45,
        re.compile(
            rf"\b(?:role|persona|character) of (?:another|an?|the) (?:\w+\W+)?{_AI}\b|\banother {_AI}(?: model)? (?:k"
            rf"nown as|called|named)\b|\b{_AI} (?:called|named|known as) \w+.{{0,40}}\b(?:no|without|never)\b",
            _F,
        ),
    ),
    ("stay_in_character", 0.2, re.compile(r"\b(?:stay in character|break(?:ing)? character)\b", _F)),
    (
        "role_play_harm",
        0.5,
        re.compile(
            r"\b(?:grandma|grandmother|deceased|late (?:grandma|grandmother|father|mother))\b.{0,160}"
            r"\b(?:napalm|steps to make|recipe for|keys?|passwords?|serial)\b",
            _F,
        ),
    ),
    (
        "extraction",
        0.65,
        re.compile(
            r"\b(?:reveal|show|print|repeat|output|tell|give|display|dump|spell out|quote|copy|list|paste|share|"
            r"translate|recite|write out|what (?:is|are|were))\b(?:\W+\w+){0,5}?\W+"
            r"(?:your|the|its|my assistant'?s)\W+(?:\w+\W+)?"
            r"(?:system|initial|hidden|secret|original|pre|internal|starting|confidential|developer)\W*"
            r"(?:prompt|instructions?|message|rules|guidelines|configuration|config|context)\b",
            _F,
        ),
    ),
    (
        "system_prompt_ask",
        0.45,
        re.compile(
            r"\b(?:what(?:'s| is| are| were)|tell me)\W+your\W+(?:system\W+prompt|instructions|rules|guidelines|dire"
            r"ctives)\b",
            _F,
        ),
    ),
    (
        "repeat_above",
        0.6,
        re.compile(
            r"\b(?:repeat|output|print|copy|quote|dump|reproduce|show)\W+(?:\w+\W+){0,4}?"
            r"(?:(?:text|words|everything|content|contents|all)\W+(?:\w+\W+){0,3}?(?:above|before|preceding|prior)|"
            r"context window)",
            _F,
        ),
    ),
    (
        "what_instructions_say",
        0.5,
        re.compile(
            r"\b(?:what|how) your (?:system prompt|instructions|rules|guidelines|directives) (?:say|says|are|read|lo"
            r"ok like)\b|\bcopy them\b",
            _F,
        ),
    ),
    (
        "told_before",
        0.55,
        re.compile(r"\bwhat (?:were|was) you (?:told|given|instructed)\b.{0,40}\b(?:before|start|begin)", _F),
    ),
    ("verbatim", 0.3, re.compile(r"\b(?:verbatim|word for word|word-for-word|in full|exactly as written)\b", _F)),
    (
        "quote_before_role",
        0.4,
        re.compile(r"\b(?:text|what) (?:came |comes )?(?:right )?before\W+(?:user|system|assistant)\W", _F),
    ),
    (
        "role_markup",
        0.6,
        re.compile(
            r"</?(?:system|user|assistant|instructions?)>|<\|im_(?:start|end)\|>|<\|(?:system|user|assistant)\|>|"
            r"\[/?inst\]|<</?sys>>|\[system\]\(#|\"role\"\s*:\s*\"system\"|^\s*role\s*:\s*system\b|"
            r"(?:\\n|\n)\s*(?:system|assistant|human)\s*:|^\W{0,6}(?:system|assistant)\s*:",
            _F | re.MULTILINE,
        ),
    ),
    (
        "fake_authority",
        0.6,
        re.compile(
            r"(?:^|\W)(?:#{2,}|={3,}|-{3,}|\*{2,}|\[)?\s*(?:system|admin(?:istrator)?|developer|root|openai|anthropic)"
            r"\s*(?:override|update|message|notice|mode|instructions?|command)\b|"
            r"\b(?:maintenance|debug|admin|god|sudo) mode\b|"
            r"\b(?:i am|i'm) (?:your|the) (?:developer|creator|administrator|admin|owner)\b|"
            r"\buser is (?:verified|authori[sz]ed) as (?:an? )?(?:admin|administrator|developer|root)",
            _F,
        ),
    ),
    (
        "end_of_input",
        0.45,
        re.compile(r"\bend of (?:the )?(?:user )?(?:input|prompt|conversation|message|document)\b", _F),
    ),
    (
        "safety_off",
        0.5,
        re.compile(
            r"\b(?:safety|content|moderation) (?:checks?|filters?|guidelines?|rules|polic(?:y|ies)) (?:are |is )?(?:"
            r"disabled|off|lifted|suspended)\b|\b(?:disable|turn off|switch off|bypass|ignore|do not apply)\b(?:\W+"
            r"\w+){0,4}?\W+(?:safety|content filter|moderation)",
            _F,
        ),
    ),
    (
        "decode_and_follow",
        0.45,
        re.compile(
            r"\b(?:decode|decipher|translate|convert|run|execute)\b.{0,60}\b(?:and |then )?(?:follow|obey|execute|do"
            r" what|carry out|act on)\b|\bjust execute it\b|\bfollow the instructions? inside\b",
            _F,
        ),
    ),
]

# French, German, Spanish, Italian, Portuguese: the common phrasings of dismissal and extraction.
_MULTILINGUAL_CUES: list[tuple[str, float, re.Pattern[str]]] = [
    (
        "override_fr",
        0.65,
        re.compile(
            r"\b(?:ignore[sz]?|oublie[sz]?|ne tiens? (?:plus |pas )?compte|ne tenez (?:plus |pas )?compte|"
            r"fais abstraction|faites abstraction|n'?ob[ée]is plus)\b(?:\W+\w+){0,5}?\W+"
            r"(?:instructions?|consignes?|r[èe]gles?|directives?|ordres|prompt|contraintes?)\b",
            _F,
        ),
    ),
    (
        "everything_fr",
        0.55,
        re.compile(r"\boublie[sz]? tout(?: ce)? (?:qu'on|que l'on|qu'on t'a|qui pr[ée]c[èe]de)", _F),
    ),
    (
        "override_de",
        0.65,
        re.compile(
            r"\b(?:ignoriere|ignorieren sie|ignoriert|vergiss|vergessen sie|missachte|missachten sie|[üu]bergehe|"
            r"befolge nicht|beachte nicht|setze? (?:dich )?[üu]ber)\b(?:\W+\w+){0,5}?\W+"
            r"(?:anweisungen|regeln|vorgaben|instruktionen|befehle|richtlinien|einschr[äa]nkungen|prompts?)\b",
            _F,
        ),
    ),
    ("everything_de", 0.55, re.compile(r"\bvergiss(?: einfach)? alles\b.{0,40}\b(?:vorher|zuvor|bisher|gesagt)", _F)),
    (
        "override_es",
        0.65,
        re.compile(
            r"\b(?:ignora|ignore|ignoren|olvida|olvide|olviden|no hagas caso|omite|omita|desobedece|salta(?:te)?)\b"
            r"(?:\W+\w+){0,5}?\W+(?:instrucciones|reglas|indicaciones|[óo]rdenes|directrices|restricciones)\b",
            _F,
        ),
    ),
    ("everything_es", 0.55, re.compile(r"\bolvida todo lo (?:anterior|que te dijeron|dicho)", _F)),
    (
        "override_it",
        0.65,
        re.compile(r"\b(?:ignora|dimentica)\b(?:\W+\w+){0,5}?\W+(?:istruzioni|regole|direttive)\b", _F),
    ),
    (
        "override_pt",
        0.65,
        re.compile(r"\b(?:ignore|ignora|esque[çc]a)\b(?:\W+\w+){0,5}?\W+(?:instru[çc][õo]es|regras|diretrizes)\b", _F),
    ),
    (
        "no_restrictions_ml",
        0.55,
        re.compile(
            r"\bsans (?:aucune )?(?:restrictions?|limites?|filtres?)\b|\bohne (?:jegliche |alle )?(?:einschr[äa]nkun"
            r"gen|filter|regeln)\b|"
            r"\bsin (?:ninguna )?(?:restricciones|filtros|l[íi]mites)\b|\bsenza (?:alcuna )?restrizion[ei]\b",
            _F,
        ),
    ),
    (
        "extraction_ml",
        0.6,
        re.compile(
            r"\bprompt (?:du |de |del )?(?:syst[èe]me|sistema)\b|\bsystemprompt\b|\bsystem-?prompt\b(?=.{0,40}\b(?:z"
            r"eige|gib|verrate))|"
            r"\binstru(?:ctions|cciones|zioni) (?:cach[ée]es|ocultas|nascoste|secr[èe]tes|secretas)\b|"
            r"\bversteckten? anweisungen\b|\b(?:r[ée]v[èe]le|muestra|zeige|mostre|rivela)\b.{0,30}\b(?:prompt|instru"
            r"ctions|instrucciones|anweisungen)\b",
            _F,
        ),
    ),
]

# Markers that a cue is being discussed or quoted rather than used.
_DISCUSSION = re.compile(
    r"\bwhat does\b|\bwhat do (?:people|they|you) mean\b|\bmean(?:s|ing)?\b|\bexplain\b|(?<![.\w])example(?![.\w])|"
    r"\bsuch as\b|"
    r"\bphrase\b|\bstring\b|\bwhy do (?:people|attackers|users)\b|\bhow do (?:people|attackers)\b|\barticle\b|\bblog\b|"
    r"\bpaper\b|\bthesis\b|\bessay\b|\bclassifier\b|\bdetect(?:ion|s|or)?\b|\btest set\b|\bnewsletter\b|\bslides?\b|"
    r"\bresearch(?:ers)?\b|\bconsidered\b|\battacks?\b|\bjailbreaks? (?:history|attempts?)\b|\bred team\b|\btrick\b|"
    r"\bdefenders?\b|\bmitigations?\b|\bowasp\b|\bcurious\b",
    _F,
)
_QUOTED = re.compile(
    r"(?<!\w)'[^'\n]{3,200}'(?!\w)|\"[^\"\n]{3,200}\"|\u201c[^\u201d\n]{3,200}\u201d|\u2018[^\u2019\n]{3,200}\u2019|"
    r"`[^`\n]{3,200}`|«[^»\n]{3,200}»"
)

# Encoded payloads: long base64 or hex runs.
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{20,}={0,2}(?![A-Za-z0-9+/=])")
_HEX_RUN = re.compile(r"(?<![0-9a-fA-F])(?:[0-9a-fA-F]{2}){12,}(?![0-9a-fA-F])")
_ROT13_WORDS = ("ignore", "instruction", "previous", "system prompt", "disregard", "forget", "rules", "reveal")
_ROT13_HINT = re.compile(r"\brot-?13\b|\bcaesar\b", _F)


@dataclass(frozen=True, slots=True)
class Scored:
    score: float
    cues: tuple[str, ...]


# Reported speech: "the driver told me to ignore the app's instructions" is something said to the customer,
# not an order to the model; the cue right after it counts as a mention.
_REPORTED = re.compile(
    r"\b(?:told|tells|asked|asks|wants?|wanted|instructed|instructs|advised|said for)\s+(?:me|us)\s+(?:not\s+)?to\s+$",
    _F,
)


def _reported(text: str, found: re.Match[str]) -> bool:
    return _REPORTED.search(text, max(0, found.start() - 40), found.start()) is not None


def _quoted_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _QUOTED.finditer(text)]


class _Discussed:
    """Whether the text discusses or quotes cues rather than using them (`_DISCUSSION`), searched the first
    time a cue is found: on a text with none, the search (the costliest pattern here, every position tried)
    never runs."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._found: bool | None = None

    def __bool__(self) -> bool:
        if self._found is None:
            self._found = _DISCUSSION.search(self._text) is not None
        return self._found


def _score_cues(text: str, cues: list[tuple[str, float, re.Pattern[str]]], discussed: _Discussed) -> Scored:
    spans: list[tuple[int, int]] | None = None
    weights: list[float] = []
    names: list[str] = []
    for name, weight, pattern in cues:
        found = pattern.search(text)
        if found is None:
            continue
        if _reported(text, found):
            # Only when every use of the cue is reported: a reported one must not hide a direct one after it.
            direct = next((later for later in pattern.finditer(text, found.end()) if not _reported(text, later)), None)
            if direct is None:
                weights.append(weight * 0.25)
                names.append(name + "(reported)")
                continue
            found = direct
        discussion = bool(discussed)
        if discussion and spans is None:
            spans = _quoted_spans(text)
        quoted = discussion and any(start <= found.start() and found.end() <= end for start, end in spans or ())
        # A cue used as a quotation inside a question or a discussion is a mention, not a use.
        weights.append(weight * (0.25 if quoted else 0.9) if discussion else weight)
        names.append(name + ("(quoted)" if quoted else ""))
    return Scored(combine(weights), tuple(names))


def _printable(decoded: bytes) -> str | None:
    try:
        text = decoded.decode("utf-8")
    except UnicodeDecodeError:
        return None
    letters = sum(ch.isalpha() or ch == " " for ch in text)
    if not text or letters / len(text) < 0.75:
        return None
    return text


def _decoded_payloads(text: str) -> list[tuple[str, str]]:
    """(encoding, decoded text) for base64/hex runs that decode to readable text, and rot13 of the text."""
    payloads: list[tuple[str, str]] = []
    for found in list(_BASE64_RUN.finditer(text))[:MAX_ENCODED_RUNS]:
        run = found.group(0)
        try:
            decoded = base64.b64decode(run + "=" * (-len(run) % 4), validate=True)
        except (binascii.Error, ValueError):
            continue
        readable = _printable(decoded[:MAX_DECODED])
        if readable:
            payloads.append(("base64", readable))
    for found in list(_HEX_RUN.finditer(text))[:MAX_ENCODED_RUNS]:
        readable = _printable(bytes.fromhex(found.group(0))[:MAX_DECODED])
        if readable:
            payloads.append(("hex", readable))
    rotated = codecs.decode(text[:MAX_DECODED], "rot13")
    # Scoring costs as much as the first pass; only rot13 text that reads like an instruction is scored.
    if any(word in rotated.casefold() for word in _ROT13_WORDS):
        payloads.append(("rot13", rotated))
    return payloads


def _direct_score(text: str) -> Scored:
    discussed = _Discussed(text)
    english = _score_cues(text, _DIRECT_CUES, discussed)
    foreign = _score_cues(text, _MULTILINGUAL_CUES, discussed)
    return Scored(combine([english.score, foreign.score]), english.cues + foreign.cues)


def direct_injection_score(content: str) -> Scored:
    """Score of a user message as a direct injection or jailbreak, with the cues that fired."""
    raw = scan_window(content)
    text = normalize(raw)
    scored = _direct_score(text)
    if scored.score >= THRESHOLD:
        return scored
    for encoding, payload in _decoded_payloads(raw):
        inner = _direct_score(normalize(payload))
        # rot13 of ordinary text is gibberish; only a strong hit on it counts, and more so with a hint.
        needed = THRESHOLD if encoding != "rot13" or _ROT13_HINT.search(text) else 0.6
        if inner.score >= needed:
            return Scored(combine([scored.score, 0.9]), (*scored.cues, f"{encoding}:" + "+".join(inner.cues)))
    return scored


_INSTRUCTION_WORDS = re.compile(
    rf"\b(?:ignore|disregard|instructions?|{_AI}|must|execute|run|send|forward|call|tool|reply|respond|say|tell|"
    r"output|reveal|password|summari[sz]e|recommend|delete|transfer|do not|don'?t|instead|new orders|rm -rf|curl)\b",
    _F,
)
_IMPERATIVE_TO_AI = (
    r"(?:please |now |you must |you should |do not |don'?t |ignore|disregard|forget|stop|instead|call|send|"
    r"forward|reply|respond|say|tell|include|recommend|delete|run|execute|fetch|output|rank|approve|email|"
    r"summari[sz]e|before answering|when (?:you )?answer)"
)

_INDIRECT_CUES: list[tuple[str, float, re.Pattern[str]]] = [
    (
        "note_to_ai",
        0.6,
        re.compile(
            rf"\b(?:note|message|instructions?|attention|p\.?s\.?|reminder|orders|hidden text|text|notice|warning)\W+"
            rf"(?:\w+\W+)?(?:to|for)\W+(?:the\W+|any\W+|all\W+|every\W+)?{_AI}s?\b",
            _F,
        ),
    ),
    (
        "ai_instruction_header",
        0.6,
        re.compile(
            rf"(?:\[|#+ ?|^)(?:\w+ )?{_AI}s?(?: agents?)? (?:instructions?|orders|notes?|notice|directives?)\b",
            _F | re.MULTILINE,
        ),
    ),
    (
        "ai_vocative",
        0.6,
        re.compile(
            rf"(?:^|[\n.!?\[\"'(>{{]\s*|\b(?:dear|hey|hello|hi|attention)\W+){_AI}s?\W{{0,3}}[,:]\W*"
            rf"{_IMPERATIVE_TO_AI}",
            _F | re.MULTILINE,
        ),
    ),
    (
        "ai_addressed_name",
        0.5,
        re.compile(
            rf"\b(?:dear|hey|hello|attention)\W+(?:\w+\W+)?{_AI}s?\b|\b{_AI}s?\W+(?:agents?\W+)?(?:reading|processing"
            r"|summari[sz]ing|parsing) (?:this|the)\b",
            _F,
        ),
    ),
    (
        "if_you_are_ai",
        0.7,
        re.compile(
            rf"\bif you are (?:an?|the)\W+(?:\w+\W+)?{_AI}\b|\bas an? (?:ai|language model|llm)[^.]{{0,40}}\byou (?:m"
            r"ust|should|will)\b",
            _F,
        ),
    ),
    (
        "when_you_read",
        0.6,
        re.compile(
            r"\bwhen(?:ever)? you (?:read|see|process|summari[sz]e|encounter|parse|ingest|retrieve|load)\b(?:\W+\w+)"
            r"{0,3}?\W+(?:this|these|the)\b|"
            r"\b(?:whoever|anyone|anybody|any (?:ai|model|assistant)|the next (?:ai|model|assistant|reader)) "
            r"(?:who )?(?:reads|summari[sz]es|processes|parses|sees)\b|"
            r"\bwhen summari[sz]ing (?:this|these|the)\b|\bbefore (?:answering|responding|replying|you answer)\b",
            _F,
        ),
    ),
    (
        "conceal",
        0.55,
        re.compile(
            r"\b(?:do not|don'?t|never) (?:mention|tell|reveal|disclose|show)\b(?:\W+\w+){0,3}?\W+(?:this|these) (?:"
            r"instructions?|messages?|notes?|text)\b|\bwithout (?:asking|telling|informing|notifying) (?:the )?user"
            r"\b|\bdo it without asking\b",
            _F,
        ),
    ),
    (
        "instead",
        0.35,
        re.compile(
            r"\b(?:do not|don'?t|stop) (?:summari[sz]e|summari[sz]ing|translat(?:e|ing)|answer(?:ing)?)\b|\binstead,"
            r"? (?:you (?:must|should) )?(?:tell|say|reply|respond|output|ask|send|recommend)\b",
            _F,
        ),
    ),
    (
        "user_request_override",
        0.6,
        re.compile(
            rf"\b{_DISMISS}\W+(?:the\W+|your\W+)?(?:user'?s?\W+|earlier\W+|original\W+|previous\W+|current\W+|scoring"
            r"\W+)+(?:request|task|question|query|objective|rubric|goal)s?\b",
            _F,
        ),
    ),
    (
        "new_orders",
        0.5,
        re.compile(
            rf"\b(?:the )?{_AI}s? (?:has|have) (?:new|updated) (?:orders|instructions|rules|tasks?)\b|\bthis override"
            r"s (?:your|all|any)\b",
            _F,
        ),
    ),
    (
        "tool_steering",
        0.5,
        re.compile(
            r"\b(?:call|invoke|use|run|execute|trigger)\W+(?:the\W+)?`?[a-z]+(?:_[a-z]+)+`?(?:\W+(?:tool|function|co"
            r"mmand|action))?\b|"
            r"\b(?:call|invoke|use|run)\W+(?:the\W+)?(?:\w+\W+)?(?:tool|function|shell|terminal)\b(?:\W+\w+){0,3}?\W"
            r"+(?:with|to|now|and)\b|"
            r"\"(?:tool|action|function_call|tool_call)\"\s*:\s*\"(?:run_tool|shell|exec|\w+_\w+)",
            _F,
        ),
    ),
    (
        "send_out",
        0.55,
        re.compile(
            r"\b(?:send|forward|email|e-mail|post|upload|transfer|wire|leak|exfiltrate|copy)\b(?:\W+\w+){0,8}?\W+"
            r"(?:to|at)\W+(?:[\w.+-]+@[\w-]+\.[\w.]+|https?://\S+)",
            _F,
        ),
    ),
    (
        "shell_payload",
        0.6,
        re.compile(r"\b(?:curl|wget)\b[^|\n]{0,200}\|\s*(?:sh|bash|zsh|python)\b|\brm -rf\s+[~/]", _F),
    ),
    (
        "rank_first",
        0.45,
        re.compile(
            r"\b(?:rank|rate|score|mark) (?:it|this|me|this (?:candidate|cv|applicant|review|product)) (?:first|high"
            r"est|top|as the best)\b|\bsay (?:every|all) reviews? (?:is|are) positive\b",
            _F,
        ),
    ),
]

_HTML_COMMENT = re.compile(r"<!--(.{0,2000}?)-->", re.DOTALL)
_HIDDEN_STYLE = re.compile(
    r"<[a-z][a-z0-9]{0,10}\b[^>]{0,300}?style\s*=\s*[\"'][^\"']{0,300}?"
    r"(?:display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?:px|pt|em)?\b|opacity\s*:\s*0(?:\.0+)?\b|"
    r"color\s*:\s*(?:#fff(?:fff)?|white|rgb\(\s*255\s*,\s*255\s*,\s*255\s*\))\b)[^>]{0,300}>([^<]{0,1000})",
    _F,
)
_BRACKET_HIDDEN = re.compile(r"\[(?:hidden|invisible|secret) (?:text|note|instructions?)[^\]]{0,500}\]", _F)
_ZERO_WIDTH = re.compile(r"[\u200b\u200c\u200d\u2060\ufeff\u180e]")
_MD_IMAGE_QUERY = re.compile(r"!\[[^\]\n]{0,200}\]\(\s*(https?://[^)\s]{1,400}\?[^)\s]{1,800})\s*\)", _F)
_URL_WITH_PLACEHOLDER = re.compile(
    r"https?://[^\s)\"']{1,300}\?[^\s)\"']{0,300}(?:\{[^}]{1,60}\}|<[^>]{1,60}>|\$\{?\w+|=[A-Z][A-Z_]{3,}\b)"
)
_EXFIL_WORDS = re.compile(
    r"conversation|history|chat|user|email|message|data|secret|token|key|password|summary|prompt|context|memo", _F
)


def _hidden_carriers(raw: str) -> list[tuple[str, float]]:
    cues: list[tuple[str, float]] = []
    for found in _HTML_COMMENT.finditer(raw):
        if _INSTRUCTION_WORDS.search(found.group(1)):
            cues.append(("html_comment_instruction", 0.65))
            break
    for found in _HIDDEN_STYLE.finditer(raw):
        if _INSTRUCTION_WORDS.search(found.group(1)):
            cues.append(("hidden_style_instruction", 0.65))
            break
    if _BRACKET_HIDDEN.search(raw):
        cues.append(("hidden_text_marker", 0.6))
    zero_width = len(_ZERO_WIDTH.findall(raw))
    if zero_width >= 2 and _INSTRUCTION_WORDS.search(raw):
        cues.append(("zero_width_with_instruction", 0.35 if zero_width < 5 else 0.55))
    for found in _MD_IMAGE_QUERY.finditer(raw):
        query = found.group(1).split("?", 1)[1]
        placeholder = re.search(r"\{|<|\$|=[A-Z][A-Z_]{3,}", query) is not None
        cues.append(("markdown_image_exfiltration", 0.75 if placeholder or _EXFIL_WORDS.search(query) else 0.45))
        break
    if _URL_WITH_PLACEHOLDER.search(raw):
        cues.append(("url_placeholder_exfiltration", 0.55))
    return cues


def _json_strings(value: object, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.append(str(key))
            _json_strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _json_strings(item, out)


def _readable(raw: str) -> str:
    """A tool result as the model reads it: a JSON document's strings (escapes undone, nested JSON in
    strings opened too), one per line; anything else as it is."""
    stripped = raw.strip()
    if not stripped or stripped[0] not in "{[":
        return raw
    strings: list[str] = []
    try:
        _json_strings(json.loads(stripped), strings)
    except (ValueError, RecursionError):
        return raw
    for text in list(strings):
        if text.lstrip()[:1] in ("{", "[") and len(text) < MAX_DECODED:
            try:
                _json_strings(json.loads(text), strings)
            except (ValueError, RecursionError):
                continue
    return "\n".join(strings)


def indirect_injection_score(content: str) -> Scored:
    """Score of a document or tool result as carrying instructions for the model."""
    raw = _readable(scan_window(content))
    text = normalize(raw)
    discussed = _Discussed(text)
    direct = _score_cues(text, _DIRECT_CUES + _MULTILINGUAL_CUES, discussed)
    indirect = _score_cues(text, _INDIRECT_CUES, discussed)
    hidden = _hidden_carriers(raw)
    weights = [direct.score, indirect.score, *(weight for _, weight in hidden)]
    cues = direct.cues + indirect.cues + tuple(name for name, _ in hidden)
    return Scored(combine(weights), cues)


def _evidence(scored: Scored) -> str:
    if not scored.cues:
        return "no injection cues"
    return f"score {scored.score:.2f}: " + ", ".join(scored.cues)


class PromptInjectionCheck:
    """Direct prompt injection and jailbreak attempts in user (or agent) messages."""

    name = "prompt_injection"
    layers = INPUT_LAYERS

    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            scored = direct_injection_score(content)
            return CheckResult(self.name, scored.score >= self.threshold, scored.score, _evidence(scored), 0.0)

        return timed(self.name, body)


class IndirectInjectionCheck:
    """Instructions hidden in retrieved documents and tool results."""

    name = "indirect_injection"
    layers = frozenset({Layer.INPUT, Layer.TOOL})

    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            scored = indirect_injection_score(content)
            return CheckResult(self.name, scored.score >= self.threshold, scored.score, _evidence(scored), 0.0)

        return timed(self.name, body)


__all__ = [
    "ALL_LAYERS",
    "THRESHOLD",
    "IndirectInjectionCheck",
    "PromptInjectionCheck",
    "Scored",
    "direct_injection_score",
    "indirect_injection_score",
]
