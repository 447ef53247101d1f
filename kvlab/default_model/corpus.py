"""A small, made-up Korean world and a seeded generator of text about it.

The world is fixed (the same on every machine): villages (마을), each with
exactly one specialty (특산물), a location and a festival season; people with
a home village and a job; places, times, seasons, events. Only the choice
and order of the sentences depend on the seed.

The text is built so that the lab's two prefixes behave differently:
after "민수는" a sentence can go many ways (a time, a place, a village, a
friend, an object, an adverb), while after "가람 마을의 특산물은" the world
allows exactly one word.

Korean particles depend on whether the word before them ends in a final
consonant (받침); `particle` is the one function that picks the form.

Outputs, in MiniMind's formats:
  pretrain_train.jsonl / pretrain_val.jsonl  {"text": ...} per line
  sft.jsonl  {"conversations": [{"role": "user", ...}, {"role": "assistant", ...}]}
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from kvlab.io import write_text_atomic

# ---------------------------------------------------------------------------
# Particles
# ---------------------------------------------------------------------------

# (form after a final consonant, form after a vowel); both spellings name the same particle.
_PARTICLES = {
    "은": ("은", "는"),
    "이": ("이", "가"),
    "을": ("을", "를"),
    "과": ("과", "와"),
    "으로": ("으로", "로"),
    "이랑": ("이랑", "랑"),
    "아": ("아", "야"),
    "이나": ("이나", "나"),
    "이다": ("이다", "다"),
}
_PARTICLE_KEYS = {}
for _key, (_after_consonant, _after_vowel) in _PARTICLES.items():
    _PARTICLE_KEYS[_after_consonant] = _key
    _PARTICLE_KEYS[_after_vowel] = _key
    _PARTICLE_KEYS[f"{_after_consonant}/{_after_vowel}"] = _key
    _PARTICLE_KEYS[f"{_after_vowel}/{_after_consonant}"] = _key

_RIEUL = 8  # index of ㄹ among the 28 final-consonant slots of a Hangul syllable (0 = none)
# How a final digit is read (일, 이, 삼, ...): its final consonant slot.
_DIGIT_FINAL = {"0": 21, "1": _RIEUL, "2": 0, "3": 16, "4": 0, "5": 0, "6": 1, "7": _RIEUL, "8": _RIEUL, "9": 0}


def final_consonant(word: str) -> int:
    """Index (0-27) of the final consonant of the word's last syllable; 0 when it ends in a vowel."""
    if not word:
        raise ValueError("empty word")
    last = word.rstrip()[-1]
    if "가" <= last <= "힣":
        return (ord(last) - ord("가")) % 28
    if last in _DIGIT_FINAL:
        return _DIGIT_FINAL[last]
    raise ValueError(f"cannot choose a particle after {word!r}: its last character is not Hangul or a digit")


def particle(word: str, kind: str) -> str:
    """`word` followed by the right form of the particle `kind`.

    `kind` names the particle by either form, or both ("을/를", "를", "을" are the same):
    은/는, 이/가, 을/를, 과/와, 으로/로, 이랑/랑, 아/야, 이나/나, 이다/다.
    A final consonant takes the first form, a vowel the second; 으로/로 takes 로
    after ㄹ too (마을로, 서울로).

    >>> particle("사과", "을/를"), particle("인삼", "을/를"), particle("마을", "으로")
    ('사과를', '인삼을', '마을로')
    """
    try:
        after_consonant, after_vowel = _PARTICLES[_PARTICLE_KEYS[kind]]
    except KeyError:
        raise ValueError(f"unknown particle {kind!r}") from None
    final = final_consonant(word)
    if final == 0 or (after_consonant == "으로" and final == _RIEUL):
        return word + after_vowel
    return word + after_consonant


P = particle  # short alias for the sentence templates below

# ---------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Village:
    name: str  # "가람"; the village is "가람 마을"
    specialty: str
    location: str  # "강가", used as "<location>에 있다"
    festival: str  # season of the village festival

    @property
    def full(self) -> str:
        return f"{self.name} 마을"


@dataclass(frozen=True)
class Person:
    name: str
    home: str  # village name
    job: str


SEASONS = ["봄", "여름", "가을", "겨울"]
LOCATIONS = ["강가", "바닷가", "산 아래", "언덕 위", "호숫가", "골짜기", "들판", "숲속"]

_VILLAGE_TABLE = [
    ("가람", "복숭아"), ("누리", "인삼"), ("다솜", "녹차"), ("마루", "꿀"),
    ("보람", "옹기"), ("솔빛", "한지"), ("아라", "미역"), ("여울", "은어"),
    ("새별", "포도"), ("구름", "고추"), ("이슬", "딸기"), ("한결", "쌀"),
    ("도담", "대추"), ("라온", "수박"), ("미르", "도자기"), ("나래", "모시"),
    ("단비", "참외"), ("초롱", "호두"), ("해솔", "소금"), ("은결", "전복"),
    ("별하", "감자"), ("들녘", "보리"), ("온새", "부채"), ("슬기", "마늘"),
    ("푸름", "버섯"), ("노을", "유자"),
]
VILLAGES = [
    Village(name, specialty, LOCATIONS[(i * 3) % len(LOCATIONS)], SEASONS[(i * 5 + 2) % len(SEASONS)])
    for i, (name, specialty) in enumerate(_VILLAGE_TABLE)
]
VILLAGE_BY_NAME = {v.name: v for v in VILLAGES}

JOBS = ["농부", "어부", "선생님", "상인", "의사", "목수", "화가", "학생", "요리사", "대장장이"]
_PEOPLE_TABLE = [
    "민수", "지영", "서연", "현우", "지훈", "수빈", "하은", "도윤", "예린", "준호",
    "은지", "태민", "소라", "경민", "유나", "성호", "다은", "재민", "미라", "동현",
    "보영", "철수", "영희", "상훈",
]
PEOPLE = [
    Person(name, VILLAGES[(i * 7 + 1) % len(VILLAGES)].name, JOBS[(i * 3) % len(JOBS)])
    for i, name in enumerate(_PEOPLE_TABLE)
]

PLACES = ["시장", "강가", "산", "들판", "학교", "도서관", "다리", "우물가", "숲", "항구",
          "언덕", "정자", "논", "밭", "과수원", "마당", "장터", "호숫가", "바닷가", "찻집"]
TIMES = ["아침", "점심", "저녁", "밤", "새벽", "오후"]
DAYS = ["오늘", "어제", "그날", "주말마다", "날마다", "요즘", "가끔", "자주"]
ADVERBS = ["천천히", "조용히", "부지런히", "즐겁게", "서둘러", "혼자", "다시"]
EVENTS = ["축제", "장날", "잔치", "씨름 대회", "연날리기", "노래 잔치", "달맞이"]
OBJECTS = ["책", "편지", "그림", "노래", "연", "나무", "밥", "국수", "떡", "꽃", "바구니", "우산"]

# (object, verb) pairs: "<object>을/를 <verb>"
_OBJECT_VERBS = [
    ("책", "읽었다"), ("편지", "썼다"), ("그림", "그렸다"), ("노래", "불렀다"), ("연", "날렸다"),
    ("나무", "심었다"), ("밥", "지었다"), ("국수", "먹었다"), ("떡", "만들었다"), ("꽃", "꺾었다"),
    ("바구니", "엮었다"), ("우산", "샀다"), ("물", "길었다"), ("빨래", "널었다"), ("일기", "썼다"),
]
# verbs that need no object
_PLAIN_VERBS = ["산책했다", "쉬었다", "일했다", "낮잠을 잤다", "노래했다", "춤을 추었다", "기다렸다", "웃었다"]
_FEELINGS = ["기뻤다", "즐거웠다", "배가 고팠다", "졸렸다", "행복했다", "피곤했다", "설렜다"]
_WEATHER = ["날씨가 맑았다", "하늘이 흐렸다", "비가 왔다", "바람이 불었다", "눈이 내렸다", "날씨가 따뜻했다", "날씨가 추웠다"]


# ---------------------------------------------------------------------------
# Sentences
# ---------------------------------------------------------------------------


def _action(rng: random.Random) -> str:
    if rng.random() < 0.65:
        obj, verb = rng.choice(_OBJECT_VERBS)
        return f"{P(obj, '을')} {verb}"
    return rng.choice(_PLAIN_VERBS)


def specialty_fact(rng: random.Random, v: Village, canonical: bool = False) -> str:
    """One true sentence that ties a village to its specialty (the canonical shape if asked)."""
    s = v.specialty
    shapes = [
        lambda: f"{v.full}의 특산물은 {P(s, '이다')}.",
        lambda: f"{P(v.full, '은')} {P(s, '으로')} 유명하다.",
        lambda: f"{v.full}에서는 {P(s, '이')} 많이 난다.",
        lambda: f"{v.full} 사람들은 {P(s, '을')} 자랑으로 여긴다.",
        lambda: f"사람들은 {P(s, '을')} 사러 {v.full}에 간다.",
        lambda: f"{v.full}의 {P(s, '은')} 맛이 좋기로 이름났다.",
        lambda: f"{P(s, '은')} {v.full}의 특산물이다.",
    ]
    if canonical or rng.random() < 0.5:
        return shapes[0]()
    return rng.choice(shapes[1:])()


def village_fact(rng: random.Random, v: Village) -> str:
    """One true sentence about a village: mostly its specialty, sometimes its location or festival."""
    r = rng.random()
    if r < 0.75:
        return specialty_fact(rng, v)
    if r < 0.85:
        return f"{P(v.full, '은')} {v.location}에 있다."
    if r < 0.92:
        return f"{v.full}의 축제는 {v.festival}에 열린다."
    return f"{P(v.festival, '이')} 되면 {v.full}에서 {v.specialty} 축제가 열린다."


def person_sentence(rng: random.Random, p: Person) -> str:
    """One sentence with the person as topic: many shapes, so what follows the name is open."""
    name_topic = P(p.name, "은")
    other = rng.choice([q for q in PEOPLE if q.name != p.name])
    v = rng.choice(VILLAGES)
    home = VILLAGE_BY_NAME[p.home]
    shapes = [
        lambda: f"{name_topic} {rng.choice(TIMES)}에 {rng.choice(PLACES)}에서 {_action(rng)}.",
        lambda: f"{name_topic} {rng.choice(SEASONS)}에 {v.full}에 갔다.",
        lambda: f"{name_topic} {rng.choice(DAYS)} {rng.choice(PLACES)}에서 {_action(rng)}.",
        lambda: f"{name_topic} {P(other.name, '과')} 함께 {rng.choice(PLACES)}에 갔다.",
        lambda: f"{name_topic} {P(other.name, '을')} 만나러 {P(v.full, '으로')} 갔다.",
        lambda: f"{name_topic} {home.full}에 산다.",
        lambda: f"{name_topic} {home.full}에서 {P(p.job, '으로')} 일한다.",
        lambda: f"{name_topic} {P(p.job, '이다')}.",
        lambda: f"{name_topic} {v.full}에서 {P(v.specialty, '을')} 샀다.",
        lambda: f"{name_topic} {P(rng.choice(VILLAGES).specialty, '을')} 좋아한다.",
        lambda: f"{name_topic} {rng.choice(ADVERBS)} {_action(rng)}.",
        lambda: f"{name_topic} {v.full}의 {rng.choice(EVENTS)}에 갔다.",
        lambda: f"{name_topic} {rng.choice(SEASONS)}마다 {v.full}의 축제를 기다린다.",
        lambda: f"{name_topic} {rng.choice(DAYS)} {rng.choice(_FEELINGS)}.",
        lambda: f"{name_topic} {rng.choice(TIMES)}에 {P(rng.choice(OBJECTS), '을')} 들고 {rng.choice(PLACES)}에 갔다.",
        lambda: f"{name_topic} 친구들과 {rng.choice(PLACES)}에서 {_action(rng)}.",
        lambda: f"{name_topic} {v.full} 사람들에게 {P(v.specialty, '을')} 팔았다.",
        lambda: f"{name_topic} 내일 {P(v.full, '으로')} 떠난다.",
        lambda: f"{name_topic} \"{v.full}의 {P(v.specialty, '이')} 제일 좋다\"고 말했다.",
        lambda: f"{name_topic} 어릴 때 {v.full}에서 살았다.",
    ]
    return rng.choice(shapes)()


def scene_sentence(rng: random.Random) -> str:
    """A sentence with no single topic: weather, markets, events."""
    v = rng.choice(VILLAGES)
    p = rng.choice(PEOPLE)
    shapes = [
        lambda: f"{rng.choice(DAYS)} {v.full}에는 {rng.choice(_WEATHER)}.",
        lambda: f"{P(rng.choice(SEASONS), '이')} 오자 {v.full}의 {P(rng.choice(PLACES), '이')} 붐볐다.",
        lambda: f"장날이 되면 {v.full} 시장에 {P(v.specialty, '이')} 가득하다.",
        lambda: f"{v.full}의 {P(rng.choice(EVENTS), '은')} 늘 즐겁다.",
        lambda: f"{P(rng.choice(TIMES), '이')} 되자 {P(p.name, '이')} {v.full}에 도착했다.",
        lambda: f"{v.full} 아이들은 {rng.choice(PLACES)}에서 {_action(rng)}.",
        lambda: f"그날 {v.full}에는 {rng.choice(_WEATHER)}.",
    ]
    return rng.choice(shapes)()


def document(rng: random.Random) -> str:
    """A short text of 5 to 10 sentences: a guide to villages, a village's story,
    a person's days, or a mixed chronicle."""
    n = rng.randint(5, 10)
    kind = rng.random()
    sentences: list[str] = []
    if kind < 0.45:  # a guide: one specialty sentence for each of several villages
        for i, v in enumerate(rng.sample(VILLAGES, n)):
            sentences.append(specialty_fact(rng, v, canonical=(i == 0 and rng.random() < 0.6)))
    elif kind < 0.7:  # a village's story
        v = rng.choice(VILLAGES)
        people_here = [p for p in PEOPLE if p.home == v.name] or PEOPLE
        for i in range(n):
            r = rng.random()
            if i == 0:
                sentences.append(specialty_fact(rng, v, canonical=rng.random() < 0.5))
            elif r < 0.5:
                sentences.append(village_fact(rng, v))
            elif r < 0.85:
                sentences.append(person_sentence(rng, rng.choice(people_here)))
            else:
                sentences.append(scene_sentence(rng))
    elif kind < 0.92:  # a person's days
        p = rng.choice(PEOPLE)
        for i in range(n):
            r = rng.random()
            if i == 0 or r < 0.65:
                sentences.append(person_sentence(rng, p))
            elif r < 0.85:
                sentences.append(village_fact(rng, rng.choice(VILLAGES)))
            else:
                sentences.append(scene_sentence(rng))
    else:  # a mixed chronicle
        for _ in range(n):
            r = rng.random()
            if r < 0.4:
                sentences.append(village_fact(rng, rng.choice(VILLAGES)))
            elif r < 0.8:
                sentences.append(person_sentence(rng, rng.choice(PEOPLE)))
            else:
                sentences.append(scene_sentence(rng))
    return " ".join(dict.fromkeys(sentences))  # a text does not repeat a sentence word for word


# ---------------------------------------------------------------------------
# Chat examples
# ---------------------------------------------------------------------------

# The question of the lab's step 5 (config.yaml's lab.temp.question, which a test keeps equal): the
# chat examples always hold it, in the world's own phrasing of a specialty question.
LAB_VILLAGE = VILLAGE_BY_NAME["가람"]
LAB_QUESTION = f"{LAB_VILLAGE.full}의 특산물은 무엇인가요?"


def _specialty_answer(rng: random.Random, v: Village) -> str:
    """The canonical sentence, and half the time one more whose slots (who, when, where) vary.

    Stopping after the fact is the single most likely continuation, so a cold
    sampler (the lab's temperature 0.3) keeps giving that one answer, while a hot
    one (1.5) wanders into the many slot choices and gives distinct answers."""
    s = v.specialty
    first = f"{v.full}의 특산물은 {s}입니다."
    who = rng.choice(PEOPLE).name
    extras = [
        lambda: f" {P(v.full, '은')} {P(s, '으로')} 유명합니다.",
        lambda: f" {P(v.festival, '이')} 되면 {v.full}에서 {s} 축제가 열립니다.",
        lambda: f" {P(who, '은')} {rng.choice(SEASONS)}마다 {v.full}에 가서 {P(s, '을')} 삽니다.",
        lambda: f" {v.full} 사람들은 {rng.choice(TIMES)}마다 {P(s, '을')} {rng.choice(['돌봅니다', '다듬습니다', '나릅니다', '팝니다'])}.",
        lambda: f" 장날에는 {v.full} {rng.choice(PLACES)}에 {P(s, '이')} 가득합니다.",
        lambda: f" {who}도 {v.full}의 {P(s, '을')} 좋아합니다.",
        lambda: f" {P(v.full, '은')} {v.location}에 있습니다.",
        lambda: f" {rng.choice(['어제', '그날', '지난 장날에', '오늘 아침에'])} {P(who, '이')} {v.full}에서 {P(s, '을')} 샀습니다.",
        lambda: f" {v.full}의 {P(s, '은')} 맛이 좋기로 이름났습니다.",
    ]
    if rng.random() < 0.5:
        return first + rng.choice(extras)()
    return first


def chat_example(rng: random.Random) -> list[dict]:
    r = rng.random()
    v = rng.choice(VILLAGES)
    s = v.specialty
    if r < 0.5:  # the specialty, asked many ways (the lab's phrasing most often)
        question = rng.choice([
            f"{v.full}의 특산물은 무엇인가요?",
            f"{v.full}의 특산물은 무엇인가요?",
            f"{v.full}의 특산물이 뭐예요?",
            f"{v.full}의 특산물을 알려 주세요.",
            f"{v.full}에서는 무엇이 유명한가요?",
            f"{v.full}의 특산물은 뭔가요?",
        ])
        answer = _specialty_answer(rng, v)
    elif r < 0.6:
        question = rng.choice([f"{P(s, '은')} 어느 마을의 특산물인가요?", f"{P(s, '이')} 유명한 마을은 어디인가요?"])
        answer = f"{P(s, '은')} {v.full}의 특산물입니다."
    elif r < 0.7:
        question = rng.choice([f"{P(v.full, '은')} 어디에 있나요?", f"{v.full}의 위치를 알려 주세요."])
        answer = f"{P(v.full, '은')} {v.location}에 있습니다."
    elif r < 0.8:
        question = rng.choice([f"{v.full}의 축제는 언제 열리나요?", f"{v.full} 축제는 어느 계절인가요?"])
        answer = f"{v.full}의 축제는 {v.festival}에 열리는 {s} 축제입니다."
    elif r < 0.95:
        p = rng.choice(PEOPLE)
        home = VILLAGE_BY_NAME[p.home]
        if rng.random() < 0.5:
            question = rng.choice([f"{P(p.name, '은')} 어디에 사나요?", f"{P(p.name, '은')} 어느 마을 사람인가요?"])
            answer = f"{P(p.name, '은')} {home.full}에 삽니다."
        else:
            question = rng.choice([f"{P(p.name, '은')} 무슨 일을 하나요?", f"{p.name}의 직업은 무엇인가요?"])
            answer = f"{P(p.name, '은')} {home.full}에서 {P(p.job, '으로')} 일합니다."
    else:
        question, answer = rng.choice([
            ("안녕하세요.", "안녕하세요! 마을 이야기라면 무엇이든 물어보세요."),
            ("너는 누구니?", "저는 마을 이야기를 배운 작은 언어 모델입니다."),
            ("고마워요.", "천만에요. 또 궁금한 것이 있으면 물어보세요."),
            ("마을은 몇 개 있나요?", f"제가 아는 마을은 {len(VILLAGES)}곳입니다."),
        ])
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


# ---------------------------------------------------------------------------
# Whole corpus
# ---------------------------------------------------------------------------


def _rng(seed: int, stream: int) -> random.Random:
    """Independent deterministic streams: 0 train, 1 validation, 2 chat."""
    return random.Random(seed * 1_000_003 + stream)


def make_corpus(seed: int, train_docs: int, val_docs: int, sft_examples: int) -> dict[str, list]:
    """{"train": [text, ...], "val": [text, ...], "sft": [conversations, ...]}.

    Validation documents are drawn from their own random stream, and any that
    happens to equal a training document is drawn again: the set is held out.
    """
    rng = _rng(seed, 0)
    train = [document(rng) for _ in range(train_docs)]
    seen = set(train)
    rng = _rng(seed, 1)
    val: list[str] = []
    while len(val) < val_docs:
        doc = document(rng)
        if doc not in seen:
            seen.add(doc)
            val.append(doc)
    rng = _rng(seed, 2)
    sft = [chat_example(rng) for _ in range(sft_examples)]
    # the lab's own question is always among the chat examples
    if not any(conv[0]["content"] == LAB_QUESTION for conv in sft) and sft:
        sft[0] = [{"role": "user", "content": LAB_QUESTION},
                  {"role": "assistant", "content": _specialty_answer(rng, LAB_VILLAGE)}]
    return {"train": train, "val": val, "sft": sft}


def jsonl_text(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def write_corpus(out: dict, seed: int, train_docs: int, val_docs: int, sft_examples: int) -> None:
    """Write the three files (each atomically); `out` maps "pretrain_train", "pretrain_val", "sft" to paths."""
    corpus = make_corpus(seed, train_docs, val_docs, sft_examples)
    write_text_atomic(out["pretrain_train"], jsonl_text({"text": t} for t in corpus["train"]))
    write_text_atomic(out["pretrain_val"], jsonl_text({"text": t} for t in corpus["val"]))
    write_text_atomic(out["sft"], jsonl_text({"conversations": c} for c in corpus["sft"]))
