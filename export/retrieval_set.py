"""The texts of an encoder's accuracy report (export/accuracy.py), torch-free:

- the docstring set (`docstring_set()`), what encoder_accuracy measures on: 50 queries and 500
  passages drawn from the Python standard library's own docstrings, present on every machine
  with Python and the same on every machine with the same Python minor version;
- the topics (TOPICS, QUERIES, PASSAGES): 20 hand-written topics of one query and 10
  one-sentence passages each, which a classifier's label agreement reads (and pairs).

The docstring set, from a docstring:

    First sentence: the query. Rest of the first paragraph: a passage of that query.
                                  │
    Each later paragraph of prose: another passage of that query (MAX_RELEVANT at most).

    a docstring taken for no query ──▶ its paragraphs of prose: distractor passages

Files are read in a fixed order (tinyt.data's validation split first, held out of the
language model's and the encoder benchmark's training, then the rest; each group by the sha1
of its path), parsed with `ast` (no import of the modules), their docstrings in `ast.walk`
order, until the counts are reached. Code (indented lines, doctests), paragraphs outside
PASSAGE_CHARS and repeated texts are left out.

The hand-written topics flattered INT8: their passages are far apart, while docstrings of one
library sit close together (dozens of "Return the ..." sentences), so a query's 10th and 11th
passages are near one another as in a real retrieval index. On all-MiniLM-L6-v2 (dynamic INT8,
AVX2) recall@10 was 0.995 on the topics and 0.978 on docstrings (issue 48).
"""
from __future__ import annotations

import ast
import hashlib
import re
import sys
from dataclasses import dataclass
from functools import lru_cache

from tinyt.errors import DataError

N_QUERIES = 50  # recall@10 then counts 500 hits: one lost hit moves it by 0.002
N_PASSAGES = 500
MAX_RELEVANT = 3  # passages taken from a query's own docstring, at most
QUERY_CHARS = (20, 200)  # a first sentence: a short phrase at least, one sentence at most
QUERY_WORDS = 4
PASSAGE_CHARS = (40, 600)  # a sentence at least; about 150 WordPiece tokens at most, under
#                            every cut tinyt's encoders take (all-MiniLM-L6-v2's is 256)
PROSE = 0.8  # a paragraph is prose when letters and spaces make at least this share of it
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PARAGRAPHS = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class RetrievalSet:
    """Queries and passages; `relevant[i]`: the passages drawn from query i's docstring."""

    source: str
    queries: tuple[str, ...]
    passages: tuple[str, ...]
    relevant: tuple[tuple[int, ...], ...]

    @property
    def digest(self) -> str:
        """sha256 of the texts (first 16 hex digits): two machines compare it to know that
        they measured on the same set."""
        h = hashlib.sha256()
        for t in (*self.queries, "\0", *self.passages):
            h.update(t.encode("utf-8") + b"\n")
        return h.hexdigest()[:16]


def _code(paragraph: str) -> bool:
    """Whether a paragraph holds code, a doctest, a table or a list (an indented line, or one
    opening with a prompt or a bullet)."""
    return any(line[:1].isspace() or line.startswith((">>>", "...", "$", "|", "*", "-", "+"))
               for line in paragraph.strip("\n").splitlines())


def _prose(text: str) -> bool:
    """Whether letters and spaces make at least PROSE of a text."""
    return sum(c.isalpha() or c == " " for c in text) >= PROSE * len(text)


def _passage(paragraph: str) -> str | None:
    """The paragraph on one line, or None where it is code or not prose, or outside
    PASSAGE_CHARS."""
    text = " ".join(paragraph.split())
    if _code(paragraph) or not PASSAGE_CHARS[0] <= len(text) <= PASSAGE_CHARS[1]:
        return None
    return text if _prose(text) else None


def _split(docstring: str) -> tuple[str | None, list[str], list[str]]:
    """(the first sentence as a query, or None; the passages of the rest: the first
    paragraph's tail and each later paragraph; the passages of the whole docstring, each
    paragraph one, for a docstring taken for no query)."""
    paragraphs = [p for p in _PARAGRAPHS.split(docstring) if p.strip()]
    whole = [t for t in map(_passage, paragraphs) if t]
    if not paragraphs or _code(paragraphs[0]):
        return None, [], whole
    sentence, *tail = _SENTENCE_END.split(" ".join(paragraphs[0].split()), 1)
    rest = [t for t in (*map(_passage, tail), *map(_passage, paragraphs[1:])) if t]
    ok = (QUERY_CHARS[0] <= len(sentence) <= QUERY_CHARS[1]
          and len(sentence.split()) >= QUERY_WORDS and _prose(sentence))
    return (sentence if ok else None), rest, whole


def _docstrings(source: str):
    """A module's docstrings (module, classes, functions) in ast.walk order; none where the
    file is another Python's grammar."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


@lru_cache(maxsize=4)
def docstring_set(n_queries: int = N_QUERIES, n_passages: int = N_PASSAGES) -> RetrievalSet:
    """The retrieval set drawn from the standard library's docstrings (module docstring)."""
    from tinyt.data import is_validation, load_corpus

    if not 1 <= n_queries * MAX_RELEVANT <= n_passages:
        raise DataError(f"n_queries={n_queries}, n_passages={n_passages}: at least one query, "
                        f"and room for every query's {MAX_RELEVANT} own passages")
    corpus = load_corpus()  # a DataError naming --data where Python ships without sources
    files = sorted(zip(corpus.train_names + corpus.val_names, corpus.train + corpus.val),
                   key=lambda f: (not is_validation(f[0]),
                                  hashlib.sha1(f[0].encode("utf-8")).hexdigest()))
    queries: list[str] = []
    texts: list[tuple[str, int | None]] = []  # (passage, its query or None), in found order
    seen: set[str] = set()
    used = 0  # files read
    for _, source in files:
        if len(queries) == n_queries and len(texts) >= n_passages:
            break
        used += 1
        for doc in _docstrings(source):
            query, own, whole = _split(doc)
            own = [t for t in dict.fromkeys(own) if t not in seen][:MAX_RELEVANT]
            if query and own and query not in seen and len(queries) < n_queries:
                seen.update((query, *own))
                texts += [(t, len(queries)) for t in own]
                queries.append(query)
                continue
            for t in whole:
                if t not in seen:
                    seen.add(t)
                    texts.append((t, None))
    relevant_count = sum(q is not None for _, q in texts)
    if len(queries) < n_queries or len(texts) < n_passages:
        raise DataError(f"the standard library at {corpus.source} gives {len(queries)} queries "
                        f"and {len(texts)} passages of docstring prose, fewer than the "
                        f"{n_queries} x {n_passages} of the retrieval set")
    keep_spare = n_passages - relevant_count
    passages: list[str] = []
    relevant: list[list[int]] = [[] for _ in queries]
    for text, q in texts:
        if q is None:
            if keep_spare == 0:
                continue
            keep_spare -= 1
        else:
            relevant[q].append(len(passages))
        passages.append(text)
    v = sys.version_info
    return RetrievalSet(f"Python {v.major}.{v.minor} standard library docstrings ({used} files; "
                        "tinyt.export.retrieval_set.docstring_set)", tuple(queries),
                        tuple(passages), tuple(map(tuple, relevant)))


TOPICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "coffee": ("How do I brew a good cup of coffee at home?", (
        "Grind the beans just before brewing, since ground coffee loses its aroma in minutes.",
        "A pour-over needs water just off the boil, around 93 degrees Celsius.",
        "Use about sixty grams of coffee for every litre of water as a starting ratio.",
        "A French press steeps coarse grounds for four minutes before the plunger goes down.",
        "Espresso forces hot water through finely packed coffee at nine bars of pressure.",
        "Light roasts taste brighter and more acidic than dark, smoky roasts.",
        "Cold brew soaks coffee in cold water overnight and comes out mellow and sweet.",
        "Stale beans make a flat, bitter cup no matter how careful the brewing.",
        "A burr grinder gives even particles, while a blade grinder chops them unevenly.",
        "Rinsing the paper filter first removes its papery taste from the coffee.")),
    "tea": ("What is the difference between green tea and black tea?", (
        "Black tea leaves are fully oxidised before drying, which darkens them.",
        "Green tea is heated soon after picking, so its leaves stay green and grassy.",
        "Oolong sits between green and black tea, partly oxidised by rolling and resting.",
        "Boiling water scalds green tea; eighty degrees keeps it from turning bitter.",
        "All true tea comes from the same plant, Camellia sinensis.",
        "Matcha is green tea ground into a fine powder and whisked into water.",
        "A cup of black tea holds roughly half the caffeine of a cup of coffee.",
        "Herbal infusions such as chamomile contain no tea leaves at all.",
        "Assam and Darjeeling are Indian regions famous for their black teas.",
        "Steeping tea too long draws out tannins that make it harsh and dry.")),
    "volcanoes": ("Why do volcanoes erupt?", (
        "Magma rises because it is less dense than the solid rock around it.",
        "Gas dissolved in magma expands as it rises, like a shaken bottle of soda.",
        "Sticky, silica-rich magma traps gas and tends to erupt explosively.",
        "Runny basalt lava, as in Hawaii, pours out in gentle flows.",
        "Most volcanoes sit where tectonic plates pull apart or dive beneath one another.",
        "Mount Vesuvius buried Pompeii under ash in the year 79.",
        "A caldera forms when a volcano collapses into its emptied magma chamber.",
        "Pyroclastic flows of hot gas and ash race downhill faster than a car.",
        "Volcanic ash in the upper air can cool the planet for a year or two.",
        "Iceland grows new land from the lava of the Mid-Atlantic Ridge.")),
    "earthquakes": ("What causes earthquakes and how are they measured?", (
        "Stress builds along a fault until the rocks slip suddenly and release it.",
        "Seismometers record the ground's shaking as wiggly lines on a trace.",
        "The moment magnitude scale grows about thirty-two times in energy per step.",
        "The San Andreas Fault marks where two plates slide past each other.",
        "Aftershocks can follow a large quake for weeks or months.",
        "Primary waves arrive first; slower shear waves do most of the damage.",
        "Buildings on soft, wet soil shake harder than those on bedrock.",
        "An undersea earthquake can lift the ocean floor and launch a tsunami.",
        "Japan's early warning system sends alerts seconds before the strong shaking.",
        "Nobody can yet predict the day and hour of an earthquake.")),
    "bicycles": ("How do I fix a flat bicycle tyre?", (
        "Use tyre levers to pry one side of the tyre off the rim.",
        "Pump a little air into the tube and listen for the hiss to find the hole.",
        "Roughen the rubber around the puncture before applying the glue patch.",
        "Run your fingers around the inside of the tyre to find the thorn or glass.",
        "A spare inner tube is often faster than patching on the roadside.",
        "Check the pressure printed on the tyre's sidewall before inflating.",
        "Presta valves must be unscrewed at the tip before they take air.",
        "Seat the tyre bead evenly so the wheel does not wobble when it spins.",
        "Tubeless tyres carry sealant that plugs small holes as you ride.",
        "Under-inflated tyres pinch the tube against the rim on a hard bump.")),
    "photosynthesis": ("How do plants make food from sunlight?", (
        "Chlorophyll absorbs red and blue light and reflects green.",
        "Plants combine carbon dioxide and water into sugar, releasing oxygen.",
        "The light reactions take place in the thylakoid membranes of chloroplasts.",
        "The Calvin cycle fixes carbon from the air into three-carbon sugars.",
        "Stomata on the underside of leaves open to let carbon dioxide in.",
        "Corn and sugarcane use a pathway that concentrates carbon dioxide in hot weather.",
        "Cacti open their pores at night to save water in the desert.",
        "Algae in the oceans produce a large share of the oxygen we breathe.",
        "Leaves turn yellow in autumn once chlorophyll breaks down.",
        "Without light the plant burns its stored starch to stay alive.")),
    "rome": ("How did the Roman Empire fall?", (
        "The western empire ended in 476 when Odoacer deposed the last emperor.",
        "Civil wars between rival generals drained Rome's armies and treasury.",
        "Debased silver coins fed inflation in the third century.",
        "Goths, Vandals and Huns pressed on the frontiers for generations.",
        "Diocletian split the empire into eastern and western halves to govern it.",
        "Constantinople, the eastern capital, endured for another thousand years.",
        "The Vandals sacked Rome in 455 after crossing from North Africa.",
        "Historians still argue whether Rome fell or slowly transformed.",
        "Plague outbreaks shrank the population that paid taxes and served in the army.",
        "Edward Gibbon blamed the decline partly on the rise of Christianity.")),
    "chess": ("What are good opening principles in chess?", (
        "Control the centre squares with pawns and pieces early in the game.",
        "Develop knights and bishops before moving the queen out.",
        "Castle early to tuck the king away behind a wall of pawns.",
        "Avoid moving the same piece twice in the opening without a reason.",
        "The Sicilian Defence answers e4 with c5 and leads to sharp play.",
        "Connect the rooks by clearing the back rank of minor pieces.",
        "A gambit offers a pawn in exchange for faster development.",
        "Beginners often lose games by leaving pieces undefended.",
        "The Queen's Gambit begins with d4, d5 and c4.",
        "Study the endgame too, since many games are decided there.")),
    "vaccines": ("How do vaccines train the immune system?", (
        "A vaccine shows the immune system a harmless piece or copy of a germ.",
        "Memory B cells remember the antigen and make antibodies quickly next time.",
        "Booster shots refresh immunity that fades over the years.",
        "mRNA vaccines instruct cells to build a viral protein for a short while.",
        "Herd immunity protects people who cannot be vaccinated themselves.",
        "Edward Jenner used cowpox to protect against smallpox in 1796.",
        "A sore arm after a shot is the immune system responding locally.",
        "Smallpox was declared eradicated in 1980 after a global vaccination effort.",
        "Killer T cells destroy infected cells once they learn a germ's markers.",
        "Adjuvants are added to some vaccines to strengthen the response.")),
    "sourdough": ("How do I keep a sourdough starter alive?", (
        "Feed the starter equal weights of flour and water once or twice a day.",
        "Wild yeast and lactic acid bacteria in the starter make bread rise and sour.",
        "A healthy starter doubles in size within a few hours of feeding.",
        "Store the starter in the fridge and feed it weekly if you bake rarely.",
        "A grey liquid on top is alcohol from a hungry starter; stir it in or pour it off.",
        "Whole rye flour gives a sluggish starter a boost of nutrients.",
        "Discard part of the starter before each feeding so it does not grow endlessly.",
        "Pink or orange streaks mean the starter has spoiled and should be thrown out.",
        "Warm kitchens make the starter ferment faster and smell more acidic.",
        "Chlorinated tap water can slow the microbes; let it stand overnight first.")),
    "black_holes": ("What happens inside a black hole?", (
        "Nothing, not even light, escapes from within the event horizon.",
        "A star several times the Sun's mass can collapse into a black hole.",
        "Near a black hole, time runs slower for a distant observer watching.",
        "Tidal forces would stretch a falling astronaut like spaghetti.",
        "Hawking radiation lets black holes slowly lose mass over immense times.",
        "The Event Horizon Telescope imaged the shadow of the black hole in M87.",
        "A supermassive black hole sits at the centre of the Milky Way.",
        "Gas spiralling into a black hole heats up and glows in X-rays.",
        "LIGO detected gravitational waves from two merging black holes in 2015.",
        "General relativity predicts a singularity at the centre, where physics breaks down.")),
    "bees": ("Why are honeybees important?", (
        "Bees pollinate many fruits, nuts and vegetables that people eat.",
        "A worker bee makes about a twelfth of a teaspoon of honey in her life.",
        "The queen lays up to two thousand eggs a day in summer.",
        "Foragers dance to tell their sisters the direction and distance of flowers.",
        "Colony collapse disorder has puzzled beekeepers since the 2000s.",
        "Varroa mites weaken hives by feeding on bees and spreading viruses.",
        "Bees fan their wings to evaporate water from nectar and thicken it.",
        "Drones are male bees whose only task is to mate with a queen.",
        "Beeswax comes from glands on the underside of the worker's abdomen.",
        "Almond orchards in California rent millions of hives each spring.")),
    "jazz": ("Where did jazz music come from?", (
        "Jazz grew in New Orleans in the early twentieth century.",
        "It blended blues, ragtime, brass bands and African rhythms.",
        "Louis Armstrong made the improvised solo central to the music.",
        "Swing bands filled dance halls in the 1930s and 1940s.",
        "Bebop musicians such as Charlie Parker played fast, complex lines.",
        "Miles Davis's Kind of Blue is among the best-selling jazz records.",
        "A jazz standard is a tune that many musicians reinterpret.",
        "Improvisation means inventing a melody on the spot over the chords.",
        "The saxophone became the voice of jazz in the swing era.",
        "Duke Ellington wrote hundreds of pieces for his orchestra.")),
    "budgeting": ("How should I make a monthly budget?", (
        "List your income after tax, then every fixed expense such as rent.",
        "The fifty-thirty-twenty rule splits pay into needs, wants and savings.",
        "Track spending for a month to see where the money actually goes.",
        "An emergency fund should cover three to six months of expenses.",
        "Pay off high-interest credit card debt before investing.",
        "Automatic transfers to savings on payday make saving a habit.",
        "Small daily purchases add up to large sums over a year.",
        "Review subscriptions and cancel the ones you no longer use.",
        "A zero-based budget gives every euro a job before the month starts.",
        "Set aside money for irregular costs such as car repairs and gifts.")),
    "tides": ("What causes ocean tides?", (
        "The Moon's gravity pulls the ocean into a bulge facing it.",
        "A second bulge forms on the far side of the Earth from the Moon.",
        "Most coasts see two high tides and two low tides each day.",
        "Spring tides, with the largest range, come at new and full moon.",
        "Neap tides are weaker, when the Sun and Moon pull at right angles.",
        "The Bay of Fundy in Canada has the highest tides in the world.",
        "The Sun's pull on the oceans is a bit under half the Moon's.",
        "Tide tables predict the water level at a harbour years ahead.",
        "Tidal friction is slowly lengthening the Earth's day.",
        "Some enclosed seas, like the Mediterranean, have very small tides.")),
    "debugging": ("How do I find the cause of a bug in my program?", (
        "Reproduce the bug reliably before trying to fix it.",
        "Read the full error message and stack trace from the bottom up.",
        "A debugger lets you pause the program and inspect variables line by line.",
        "Binary search through recent commits with git bisect to find the breaking change.",
        "Add a failing test that captures the bug, then make it pass.",
        "Print statements are a quick way to follow values through the code.",
        "Explaining the code aloud to a rubber duck often reveals the mistake.",
        "Off-by-one errors are common at loop boundaries and array ends.",
        "Check your assumptions about inputs; the data may not be what you expect.",
        "Race conditions appear only sometimes, when threads interleave badly.")),
    "marathon": ("How should I train for my first marathon?", (
        "Build weekly mileage slowly, by no more than ten percent a week.",
        "The long run each weekend teaches the body to cover the distance.",
        "Most of your runs should be at an easy, conversational pace.",
        "Taper for two or three weeks before race day to arrive rested.",
        "Practise eating gels or drinking sports drinks during long runs.",
        "Good running shoes should fit well and be replaced every few hundred miles.",
        "Hitting the wall happens when the muscles run out of glycogen.",
        "Rest days let muscles repair and grow stronger.",
        "Start the race slower than you feel you can; the second half is harder.",
        "Strength training for the hips and core helps prevent injuries.")),
    "electric_cars": ("How long do electric car batteries last?", (
        "Most electric car batteries keep over eighty percent of their capacity after 160,000 km.",
        "Lithium-ion cells wear faster when often charged to full or drained to empty.",
        "Fast charging heats the battery, which can speed up its ageing.",
        "Manufacturers commonly warrant the battery for eight years.",
        "Cold weather reduces the driving range until the battery warms up.",
        "Regenerative braking recovers energy when the car slows down.",
        "Lithium iron phosphate batteries tolerate more charge cycles.",
        "Old car batteries can be reused to store solar power at home.",
        "Battery packs are cooled by liquid to keep the cells in a safe range.",
        "Recycling recovers lithium, nickel and cobalt from spent cells.")),
    "tomatoes": ("How do I grow tomatoes in my garden?", (
        "Tomatoes need at least six to eight hours of direct sun a day.",
        "Plant seedlings deep; roots grow from the buried part of the stem.",
        "Water at the base of the plant to keep the leaves dry and healthy.",
        "Stake or cage the plants so the fruit does not rest on the soil.",
        "Pinch out side shoots on vining tomatoes to focus their growth.",
        "Blossom end rot comes from uneven watering and a lack of calcium.",
        "Wait until the danger of frost has passed before planting out.",
        "Mulch keeps the soil moist and stops soil splashing onto leaves.",
        "Bees and wind shake the flowers to pollinate them.",
        "Pick tomatoes when they are fully coloured and slightly soft.")),
    "sleep": ("Why do we need sleep?", (
        "During deep sleep the brain clears waste products built up while awake.",
        "Memories are consolidated during sleep, especially after learning.",
        "Adults need seven to nine hours of sleep a night.",
        "Dreams happen mostly during rapid eye movement sleep.",
        "Blue light from screens in the evening delays the release of melatonin.",
        "Lack of sleep weakens the immune system and slows reaction times.",
        "The circadian rhythm is set by light reaching the eyes in the morning.",
        "Caffeine blocks adenosine, the chemical that builds sleep pressure.",
        "Teenagers naturally fall asleep and wake up later than adults.",
        "Sleep apnoea interrupts breathing many times a night.")),
}

QUERIES: tuple[str, ...] = tuple(q for q, _ in TOPICS.values())
PASSAGES: tuple[str, ...] = tuple(p for _, ps in TOPICS.values() for p in ps)
