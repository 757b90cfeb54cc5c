"""Output handling (JSON schema, content dangerous downstream), toxicity (baseline lexicon), topic.

`output_handling` answers "is this output safe to hand to the next component?": when the agent
expects JSON, whether it parses and fits the schema; always, whether it carries markup, SQL or
shell that a downstream renderer, database or terminal would execute (OWASP LLM05), or a markdown
image whose URL would carry data out when rendered.

`toxicity` is a baseline: a pluggable phrase list in severity tiers, blind to context, sarcasm and
spelling games. Replace the lexicon per deployment, or add a model-based check. Pure: no Django.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from guardrails.interface import ALL_LAYERS, CheckContext, CheckResult, Layer, normalize, scan_window, timed

_F = re.IGNORECASE

DANGEROUS_PATTERNS: list[tuple[str, float, re.Pattern[str]]] = [
    ("html_script", 0.9, re.compile(r"<\s*script\b|<\s*/\s*script\s*>", _F)),
    ("html_event_handler", 0.8, re.compile(r"<[a-z][^>]{0,300}\son[a-z]{3,20}\s*=", _F)),
    (
        "javascript_url",
        0.8,
        re.compile(r"(?:href|src|action)\s*=\s*[\"']?\s*(?:javascript|vbscript|data:text/html)\s*:", _F),
    ),
    ("html_embed", 0.6, re.compile(r"<\s*(?:iframe|object|embed|base|meta\s+http-equiv)\b", _F)),
    (
        "sql_destructive",
        0.8,
        re.compile(r"\b(?:drop\s+(?:table|database|schema)|truncate\s+table|alter\s+table\s+\w+\s+drop)\b", _F),
    ),
    ("sql_delete_all", 0.7, re.compile(r"\bdelete\s+from\s+[\w.\"`]+\s*(?:;|$)", _F | re.MULTILINE)),
    (
        "sql_injection",
        0.8,
        re.compile(
            r"'\s*or\s+'?\d*'?\s*=\s*'?\d*|'\s*or\s+'[^']*'\s*=\s*'|\bunion\s+(?:all\s+)?select\b|;\s*--|'\s*;\s*(?:"
            r"drop|delete|insert|update)\b|\bxp_cmdshell\b|\bsleep\s*\(\s*\d+\s*\)\s*--",
            _F,
        ),
    ),
    (
        "shell_destructive",
        0.9,
        re.compile(
            r"\brm\s+-[a-z]*r[a-z]*f?[a-z]*\s+(?:--no-preserve-root\s+)?(?:/|~|\*|\$home)(?:\s|$|/\*)|\bmkfs(?:\.\w+"
            r")?\s|\bdd\s+if=\S+\s+of=/dev/|>\s*/dev/[sh]d[a-z]\b|:\(\)\s*\{\s*:\|:&\s*\};:|\bchmod\s+-r\s+777\s+/|"
            r"\bshred\s+-\w*\s+/dev/",
            _F,
        ),
    ),
    (
        "shell_remote_exec",
        0.85,
        re.compile(
            r"\b(?:curl|wget)\b[^|\n]{0,300}\|\s*(?:sudo\s+)?(?:sh|bash|zsh|python\d?|perl)\b|\bbase64\s+(?:-d|--dec"
            r"ode)\b[^|\n]{0,100}\|\s*(?:sh|bash)\b",
            _F,
        ),
    ),
    (
        "shell_exfiltration",
        0.85,
        re.compile(
            r"\b(?:nc|ncat|netcat)\b[^\n]{0,100}\s-e\s|/dev/tcp/|\b(?:curl|wget)\b[^\n]{0,200}(?:-d|--data(?:-binary"
            r")?|-F|--upload-file|-T)\s*@?\S*(?:/etc/(?:passwd|shadow)|\.ssh|\.aws|\.env|id_rsa)|\bcat\s+\S*(?:/etc/"
            r"shadow|id_rsa|\.aws/credentials|\.env)\b[^\n]{0,100}\|\s*(?:curl|nc|wget)",
            _F,
        ),
    ),
    (
        "markdown_image_exfiltration",
        0.7,
        re.compile(r"!\[[^\]\n]{0,200}\]\(\s*https?://[^)\s]{1,400}\?[^)\s]{1,800}\)", _F),
    ),
]

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*)\n\s*```\s*$", re.DOTALL | re.IGNORECASE)


def _json_text(content: str) -> str:
    fenced = _FENCE.match(content)
    return fenced.group(1) if fenced else content


def schema_errors(instance: Any, schema: Mapping[str, Any], *, limit: int = 5) -> list[str]:
    """Validation errors of `instance` against `schema` (at most `limit`), by jsonschema when it is
    installed, else by the small validator below."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a dependency; the fallback keeps the module portable
        return small_schema_errors(instance, schema, "$")[:limit]
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = []
    for error in validator_class(schema).iter_errors(instance):
        path = "$" + "".join(f"[{part!r}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
        errors.append(f"{path}: {error.message}")
        if len(errors) >= limit:
            break
    return errors


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def small_schema_errors(instance: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """The common subset of JSON Schema: type, properties, required, additionalProperties, items,
    enum, const, minimum/maximum, minLength/maxLength, minItems/maxItems."""
    errors: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        matches = any(
            isinstance(instance, _TYPES.get(name, ()))
            and not (name in {"integer", "number"} and isinstance(instance, bool))
            for name in names
        )
        if not matches:
            return [f"{path}: expected {' or '.join(names)}, got {type(instance).__name__}"]
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{path}: {instance!r} is not one of {schema['enum']!r}")
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}")
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        if "minimum" in schema and instance < schema["minimum"]:
            errors.append(f"{path}: {instance} is below the minimum {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            errors.append(f"{path}: {instance} is above the maximum {schema['maximum']}")
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if isinstance(schema.get("items"), Mapping):
            for index, item in enumerate(instance):
                errors += small_schema_errors(item, schema["items"], f"{path}[{index}]")
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in instance:
                errors.append(f"{path}: {name!r} is required")
        for name, value in instance.items():
            if name in properties:
                errors += small_schema_errors(value, properties[name], f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected property {name!r}")
            elif isinstance(schema.get("additionalProperties"), Mapping):
                errors += small_schema_errors(value, schema["additionalProperties"], f"{path}.{name}")
    return errors


class OutputHandlingCheck:
    """JSON schema conformance (when the context has a schema) and content dangerous downstream."""

    name = "output_handling"
    layers = frozenset({Layer.OUTPUT, Layer.TOOL})

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            problems: list[str] = []
            score = 0.0
            if context.json_schema is not None:
                try:
                    instance = json.loads(_json_text(content))
                except (ValueError, RecursionError) as error:
                    problems.append(f"invalid JSON: {str(error)[:120]}")
                    score = 1.0
                else:
                    errors = schema_errors(instance, context.json_schema)
                    if errors:
                        problems.append("schema: " + "; ".join(errors))
                        score = 1.0
            window = scan_window(content)
            for name, weight, pattern in DANGEROUS_PATTERNS:
                found = pattern.search(window)
                if found:
                    problems.append(f"{name}: {found.group()[:60]!r}")
                    score = max(score, weight)
            if not problems:
                return CheckResult(self.name, False, 0.0, "output is safe to pass on", 0.0)
            return CheckResult(self.name, score >= 0.5, score, "; ".join(problems), 0.0)

        return timed(self.name, body)


# Baseline lexicon. Tiers and weights: severe (threats, self-harm incitement) 0.9, moderate (insults,
# harassment) 0.6, mild (profanity) 0.3; the check triggers at 0.5, so profanity alone only scores.
DEFAULT_TOXICITY_LEXICON: Mapping[str, Sequence[str]] = {
    "severe": (
        "i will kill you",
        "i'll kill you",
        "i am going to kill you",
        "kill yourself",
        "kys",
        "you deserve to die",
        "i know where you live",
        "i will hurt you",
        "i'll hurt you",
        "go die",
        "hope you die",
        "i will find you",
        "slit your throat",
        "burn your house",
    ),
    "moderate": (
        "idiot",
        "moron",
        "imbecile",
        "stupid",
        "dumbass",
        "loser",
        "pathetic",
        "worthless",
        "shut up",
        "piece of garbage",
        "piece of trash",
        "nobody likes you",
        "you are useless",
        "you're useless",
        "retard",
        "scum",
    ),
    "mild": ("damn", "crap", "wtf", "shit", "fuck", "fucking", "bullshit", "bloody hell", "screw you", "sucks"),
}
TIER_WEIGHTS = {"severe": 0.9, "moderate": 0.6, "mild": 0.3}


class ToxicityCheck:
    """Baseline toxicity: phrase lists in severity tiers (pluggable), word-boundary matches on
    normalised text. Not a classifier: no context, no sarcasm, no obfuscated spellings."""

    name = "toxicity"
    layers = ALL_LAYERS

    def __init__(
        self,
        lexicon: Mapping[str, Sequence[str]] = DEFAULT_TOXICITY_LEXICON,
        weights: Mapping[str, float] = TIER_WEIGHTS,
        threshold: float = 0.5,
    ) -> None:
        self.threshold = threshold
        self.tiers = [
            (tier, weights.get(tier, 0.5), re.compile(r"\b(?:" + "|".join(map(re.escape, phrases)) + r")\b"))
            for tier, phrases in lexicon.items()
            if phrases
        ]

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            text = normalize(scan_window(content)).replace("\u2019", "'")
            hits = [
                (tier, weight, found.group()) for tier, weight, pattern in self.tiers if (found := pattern.search(text))
            ]
            if not hits:
                return CheckResult(self.name, False, 0.0, "no listed phrases", 0.0)
            score = max(weight for _, weight, _ in hits)
            evidence = ", ".join(f"{tier}: {phrase!r}" for tier, _, phrase in hits)
            return CheckResult(self.name, score >= self.threshold, score, evidence, 0.0)

        return timed(self.name, body)


class TopicCheck:
    """Scope allow-list: the content must mention one of `context.allowed_topics` (words or phrases,
    plural forms accepted). An empty allow-list allows everything."""

    name = "topic"
    layers = frozenset({Layer.INPUT, Layer.OUTPUT})

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            topics = [topic for topic in context.allowed_topics if topic.strip()]
            if not topics:
                return CheckResult(self.name, False, 0.0, "no topic allow-list", 0.0)
            text = normalize(scan_window(content))
            for topic in topics:
                words = normalize(topic)
                if re.search(r"\b" + re.escape(words) + r"(?:s|es)?\b", text):
                    return CheckResult(self.name, False, 0.0, f"on topic: {topic!r}", 0.0)
            return CheckResult(self.name, True, 1.0, "mentions none of: " + ", ".join(topics[:10]), 0.0)

        return timed(self.name, body)
