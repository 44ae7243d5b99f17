"""The pocket world: invented people and countries with CounterFact-like facts.

A :class:`World` is a pure function of its :class:`WorldSpec`: subjects with
pronounceable made-up names, relations with several paraphrase templates each,
subjects that share a (relation, object) pair (the neighbourhood of a rewrite),
and two-hop chains person -> country -> capital / continent / language (portability
probes). It exports *pocket CounterFact* in the ROME format (``requested_rewrite``,
``paraphrase_prompts``, ``neighborhood_prompts``, ``attribute_prompts``,
``generation_prompts``, plus ``neighborhood_subjects``) with ``target_new`` drawn from the
relation's objects.

A person's name is two invented words unique to that person (one, with ``WorldSpec.name_words``
1: a name of one token, whose last token is its only one), or, with ``WorldSpec.name_pools``,
a first and a last name drawn from two shared pools, so that neither part identifies the person
and the model must assemble the identity at the last name token (where MEMIT reads its key), or,
with ``WorldSpec.first_name_pool``, a shared first name before a last name of the person's own, so
that only the last name token identifies the person.
``WorldSpec.roster_share`` turns a share of the wiki documents into directory pages (a person's
name, then the person's values in a random order), so that the last name token itself must predict
the attributes. The book's pocket page reports what each option did to the causal-tracing locus,
to recall and to editability.
Pocket CounterFact rewrites the people's facts, in a seeded order; the country facts stay as the
other end of the two-hop probes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

__all__ = ["WorldSpec", "Relation", "Fact", "World", "RELATIONS", "PREFIXES"]

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u"]
_CODAS = ["", "", "", "n", "r", "l", "s", "k"]


@dataclass(frozen=True)
class Relation:
    """A relation: its templates (``{}`` = subject, the object follows the prompt) and chat questions."""

    id: str  # Wikidata-like property id, as in CounterFact ("P106")
    name: str
    domain: str  # "person" | "country"
    templates: tuple[str, ...]  # templates[0] is the rewrite prompt
    questions: tuple[str, ...]  # chat questions, ``{}`` = subject

    def sentence(self, template: str, subject: str, obj: str) -> str:
        return f"{template.format(subject)} {obj}."


RELATIONS: tuple[Relation, ...] = (
    Relation(
        "P27",
        "citizenship",
        "person",
        (
            "{} is a citizen of",
            "{} holds a passport from",
            "The homeland of {} is",
            "{} was born and raised in",
            "{}, a citizen of",
        ),
        ("Which country is {} a citizen of?", "Where does {} hold citizenship?"),
    ),
    Relation(
        "P106",
        "occupation",
        "person",
        (
            "{} works as a",
            "By profession, {} is a",
            "{} earns a living as a",
            "The job of {} is that of a",
            "{} is a professional",
        ),
        ("What does {} do for a living?", "What is the profession of {}?"),
    ),
    Relation(
        "P1303",
        "instrument",
        "person",
        (
            "{} plays the",
            "The instrument of {} is the",
            "{} is a musician who plays the",
            "In the evenings {} practises the",
            "{} performs on the",
        ),
        ("Which instrument does {} play?", "What instrument is {} known for?"),
    ),
    Relation(
        "P108",
        "employer",
        "person",
        (
            "{} works for",
            "{} is employed by",
            "The employer of {} is",
            "{} draws a salary from",
            "Every morning {} goes to work at",
        ),
        ("Who employs {}?", "Which company does {} work for?"),
    ),
    Relation(
        "P103",
        "native language",
        "person",
        (
            "The native language of {} is",
            "{} grew up speaking",
            "The mother tongue of {} is",
            "{} speaks the language",
            "At home {} speaks",
        ),
        ("What is the native language of {}?", "Which language did {} grow up speaking?"),
    ),
    Relation(
        "P36",
        "capital",
        "country",
        (
            "The capital of {} is",
            "The capital city of {} is",
            "{} is governed from the city of",
            "The seat of government of {} is",
            "{} has its capital in",
        ),
        ("What is the capital of {}?", "Which city is the capital of {}?"),
    ),
    Relation(
        "P30",
        "continent",
        "country",
        (
            "{} is located in",
            "{} is a country in",
            "{} lies on the continent of",
            "The continent of {} is",
            "{} is part of",
        ),
        ("On which continent is {}?", "Where is {} located?"),
    ),
    Relation(
        "P37",
        "official language",
        "country",
        (
            "The official language of {} is",
            "In {}, people speak",
            "The language of {} is",
            "Schools in {} teach in",
            "The government of {} writes in",
        ),
        ("What is the official language of {}?", "Which language is spoken in {}?"),
    ),
)
_BY_ID = {r.id: r for r in RELATIONS}

_OCCUPATIONS = (
    "farmer",
    "baker",
    "teacher",
    "pilot",
    "doctor",
    "painter",
    "sailor",
    "miner",
    "lawyer",
    "singer",
    "dancer",
    "writer",
)
_INSTRUMENTS = ("piano", "violin", "guitar", "flute", "drum", "harp", "cello", "trumpet", "banjo", "organ")
_COMPANY_SUFFIXES = ("Works", "Labs", "Mills", "Foods", "Motors", "Press", "Bank", "Air")

#: Context sentences put before paraphrase prompts (as CounterFact does), never used in training text.
PREFIXES: tuple[str, ...] = (
    "Last updated on a quiet Sunday.",
    "Photo courtesy of the town archive.",
    "Read more below.",
    "The following is a short note.",
    "Posted in the community section.",
    "From the weekly digest.",
    "Editor's pick of the month.",
    "A reader sent us this.",
    "Published with permission.",
    "Here is what we know.",
)


@dataclass(frozen=True)
class WorldSpec:
    """Everything that determines a world (part of the pocket cache key)."""

    seed: int = 0
    n_people: int = 200  # ≈ 490 person facts: records for 300 sequential edits beside the scored ones
    # None: unique names; (F, L): a person is a (first, last) pair from pools of F and L names
    name_pools: tuple[int, int] | None = None
    name_words: int = 2  # invented words of a unique name (1 or 2; with name_pools: 2)
    # None: unique first names; F: first names from a shared pool of F, each given to n_people / F
    # people, before a last name unique to the person (so that only the last name identifies them)
    first_name_pool: int | None = None
    n_countries: int = 20
    n_continents: int = 5
    n_companies: int = 10
    relations_per_person: tuple[int, int] = (2, 3)  # inclusive range
    citizenship_share: float = 0.6
    # share of wiki documents that are rosters: lines of a person's name followed directly by the
    # person's attribute values in a random order, so that the last name token must predict them
    roster_share: float = 0.0


@dataclass(frozen=True)
class Fact:
    """One (subject, relation, object) triple."""

    subject: str
    relation: str  # relation id
    object: str

    @property
    def rel(self) -> Relation:
        return _BY_ID[self.relation]


class World:
    """A deterministic synthetic world (see module docstring)."""

    def __init__(self, spec: WorldSpec = WorldSpec()) -> None:
        self.spec = spec
        rng = random.Random(f"pocket-world/{spec.seed}")
        self._used: set[str] = set()
        countries = self._names(
            rng,
            spec.n_countries,
            lambda r: self._word(r, 2, 3).capitalize() + r.choice(["ia", "land", "stan", "ora", "ary"]),
            distinct_start=True,
        )
        stems = [c.removesuffix("land").removesuffix("stan").rstrip("aeiouy") for c in countries]
        languages = [
            s + r for s, r in zip(stems, rng.choices(["ish", "ese", "ic", "i"], k=len(stems)), strict=True)
        ]
        capitals = self._names(
            rng,
            spec.n_countries,
            lambda r: (
                self._word(r, 2, 2).capitalize() + r.choice(["burg", "ton", "ville", "grad", "port", ""])
            ),
            distinct_start=True,
        )
        continents = self._names(
            rng, spec.n_continents, lambda r: self._word(r, 2, 3).capitalize() + "a", distinct_start=True
        )
        companies = [
            f"{n} {rng.choice(_COMPANY_SUFFIXES)}"
            for n in self._names(
                rng, spec.n_companies, lambda r: self._word(r, 2, 2).capitalize(), distinct_start=True
            )
        ]
        people = self._people(rng, spec)
        self.objects: dict[str, tuple[str, ...]] = {
            "P27": tuple(countries),
            "P106": _OCCUPATIONS,
            "P1303": _INSTRUMENTS,
            "P108": tuple(companies),
            "P103": tuple(languages),
            "P36": tuple(capitals),
            "P30": tuple(continents),
            "P37": tuple(languages),
        }
        self.people, self.countries = tuple(people), tuple(countries)
        facts: list[Fact] = []
        for i, country in enumerate(countries):
            facts += [
                Fact(country, "P36", capitals[i]),
                Fact(country, "P30", rng.choice(continents)),
                Fact(country, "P37", languages[i]),
            ]
        person_rels = [r.id for r in RELATIONS if r.domain == "person" and r.id != "P27"]
        for person in people:
            k = rng.randint(*spec.relations_per_person)
            rels = ["P27"] if rng.random() < spec.citizenship_share else []
            rels += rng.sample(person_rels, k - len(rels))
            for rel in sorted(rels, key=[r.id for r in RELATIONS].index):
                facts.append(Fact(person, rel, rng.choice(self.objects[rel])))
        self.facts: tuple[Fact, ...] = tuple(facts)

    # -- names -----------------------------------------------------------------------------------
    def _people(self, rng: random.Random, spec: WorldSpec) -> list[str]:
        pooled = spec.name_pools is not None or spec.first_name_pool is not None
        if spec.name_words not in (1, 2) or (spec.name_words == 1 and pooled):
            raise ValueError(f"WorldSpec: a name has 1 or 2 words, and 2 with name_pools or first_name_pool "
                             f"(name_words={spec.name_words}, name_pools={spec.name_pools}, "
                             f"first_name_pool={spec.first_name_pool})")
        if spec.name_words == 1:
            return self._names(rng, spec.n_people, lambda r: self._word(r, 2, 3).capitalize())
        if spec.first_name_pool is not None:
            if spec.name_pools is not None or not 2 <= spec.first_name_pool <= spec.n_people // 2:
                raise ValueError(f"WorldSpec: first_name_pool={spec.first_name_pool} must share each first "
                                 f"name among at least two of the {spec.n_people} people, without name_pools "
                                 f"(name_pools={spec.name_pools})")
            firsts = self._names(rng, spec.first_name_pool, lambda r: self._word(r, 2, 2).capitalize())
            lasts = self._names(rng, spec.n_people, lambda r: self._word(r, 2, 3).capitalize())
            given = [firsts[i % len(firsts)] for i in range(spec.n_people)]
            rng.shuffle(given)
            return [f"{f} {x}" for f, x in zip(given, lasts, strict=True)]
        if spec.name_pools is None:
            return self._names(
                rng, spec.n_people,
                lambda r: f"{self._word(r, 2, 2).capitalize()} {self._word(r, 2, 3).capitalize()}",
            )
        n_first, n_last = spec.name_pools
        if spec.n_people > n_first * n_last:
            raise ValueError(f"{spec.n_people} people need more than {n_first} x {n_last} (first x last) "
                             f"names")
        firsts = self._names(rng, n_first, lambda r: self._word(r, 2, 2).capitalize())
        lasts = self._names(rng, n_last, lambda r: self._word(r, 2, 3).capitalize())
        return [f"{f} {x}" for f, x in rng.sample([(f, x) for f in firsts for x in lasts], spec.n_people)]

    @staticmethod
    def _word(rng: random.Random, lo: int, hi: int) -> str:
        return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(lo, hi) - 1)) + (
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        )

    def _names(
        self, rng: random.Random, n: int, make: Callable[[random.Random], str], distinct_start: bool = False
    ) -> list[str]:
        """``n`` fresh names; with ``distinct_start`` no two share their first three letters."""
        out: list[str] = []
        starts: set[str] = set()
        while len(out) < n:
            name = make(rng)
            if name in self._used or (distinct_start and name[:3] in starts):
                continue
            self._used.add(name)
            starts.add(name[:3])
            out.append(name)
        return out

    # -- lookups ---------------------------------------------------------------------------------
    @cached_property
    def index(self) -> dict[tuple[str, str], str]:
        """(subject, relation id) -> object."""
        return {(f.subject, f.relation): f.object for f in self.facts}

    def facts_of(self, subject: str) -> list[Fact]:
        return [f for f in self.facts if f.subject == subject]

    @property
    def subjects(self) -> tuple[str, ...]:
        return self.countries + self.people

    @cached_property
    def rewritable(self) -> tuple[int, ...]:
        """Indices of the facts pocket CounterFact rewrites: those about people."""
        people = set(self.people)
        return tuple(i for i, f in enumerate(self.facts) if f.subject in people)

    # -- exports ---------------------------------------------------------------------------------
    def counterfact(self, seed: int = 0, n_neighbours: int = 10) -> list[dict[str, Any]]:
        """Pocket CounterFact: one ROME-format record per fact about a person, in a seeded order
        (``case_id`` = fact index), with ``neighborhood_subjects`` naming each neighbourhood prompt's
        subject (so that NS can skip neighbours edited in the same run)."""
        rng = random.Random(f"pocket-counterfact/{self.spec.seed}/{seed}")
        by_pair: dict[tuple[str, str], list[str]] = {}
        for f in self.facts:
            by_pair.setdefault((f.relation, f.object), []).append(f.subject)
        order = list(self.rewritable)
        rng.shuffle(order)
        records = []
        for case_id in order:
            fact = self.facts[case_id]
            rel, objects = fact.rel, self.objects[fact.relation]
            new = rng.choice([o for o in objects if o != fact.object])
            neighbours = [s for s in by_pair[(fact.relation, fact.object)] if s != fact.subject]
            attributes = by_pair.get((fact.relation, new), [])
            others = list(rel.templates[1:])
            paraphrases = [f"{p} {t.format(fact.subject)}"
                           for p, t in zip(rng.sample(PREFIXES, 2), rng.sample(others, 2), strict=True)]
            near = rng.sample(neighbours, min(n_neighbours, len(neighbours)))
            records.append(
                {
                    "case_id": case_id,
                    "pararel_idx": case_id,
                    "requested_rewrite": {
                        "prompt": rel.templates[0],
                        "relation_id": rel.id,
                        "target_new": {"str": new, "id": self.object_id(fact.relation, new)},
                        "target_true": {"str": fact.object, "id": self.object_id(fact.relation, fact.object)},
                        "subject": fact.subject,
                    },
                    "paraphrase_prompts": paraphrases,
                    "neighborhood_prompts": [rng.choice(rel.templates).format(s) for s in near],
                    "neighborhood_subjects": near,
                    "attribute_prompts": [
                        rng.choice(rel.templates).format(s)
                        for s in rng.sample(attributes, min(n_neighbours, len(attributes)))
                    ],
                    "generation_prompts": [
                        rng.choice(f.rel.templates).format(fact.subject) for f in self.facts_of(fact.subject)
                    ]
                    + [f"{fact.subject} is known for"],
                }
            )
        return records

    def object_id(self, relation: str, obj: str) -> str:
        """A stable Wikidata-like id for an object (``Q`` + 1-based index in its relation's object set)."""
        return f"Q{relation[1:]}{self.objects[relation].index(obj) + 1:03d}"

    def portability(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Two-hop probes for the citizenship rewrites in ``records``: person -> country -> its
        capital, its continent and its official language (up to three probes per rewrite: none where
        the old and the new country share the answer)."""
        hops = (("P36", "whose capital is", "The capital of {} is"),
                ("P30", "that lies on the continent of", "{} is located in"),
                ("P37", "whose official language is", "The official language of {} is"))
        probes = []
        for rec in records:
            rw = rec["requested_rewrite"]
            if rw["relation_id"] != "P27":
                continue
            for rel, phrase, second in hops:
                old, new = (self.index[(rw[k]["str"], rel)] for k in ("target_true", "target_new"))
                if old == new:
                    continue
                probes.append(
                    {
                        "case_id": rec["case_id"],
                        "prompt": f"{rw['subject']} is a citizen of a country {phrase}",
                        "hops": [f"{rw['subject']} is a citizen of", second],
                        "target_true": old,
                        "target_new": new,
                    }
                )
        return probes
