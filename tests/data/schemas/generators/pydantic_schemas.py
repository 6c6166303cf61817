"""Writes the JSON Schemas Pydantic 1 (Debian's python3-pydantic 1.10,
Model.schema()) produces for typical models into this folder as
pydantic1-NAME.json (issue 29: the schemas Python clients send). Run:
/usr/bin/python3 tests/data/schemas/generators/pydantic_schemas.py [OUTDIR]"""
import datetime
import decimal
import enum
import ipaddress
import json
import pathlib
import sys
import uuid
from typing import Dict, FrozenSet, List, Literal, Optional, Set, Tuple, Union

from pydantic import AnyUrl, BaseModel, Field, HttpUrl, SecretStr, conbytes, conint, confloat, conlist, constr


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Level(enum.IntEnum):
    low = 1
    mid = 2
    high = 3


class Address(BaseModel):
    street: constr(max_length=40)
    city: constr(max_length=30)
    zip: constr(regex=r"^\d{5}$")


class Person(BaseModel):
    name: constr(max_length=30)
    age: int


class PersonOptional(BaseModel):
    name: constr(max_length=30)
    nickname: Optional[constr(max_length=10)] = None
    age: Optional[conint(ge=0, le=150)] = None


class WithAddress(BaseModel):
    name: constr(max_length=20)
    address: Address
    previous: List[Address] = Field(default_factory=list, max_items=2)


class WithEnum(BaseModel):
    color: Color
    level: Level = Level.low


class WithEnumDescribed(BaseModel):
    color: Color = Field(..., description="the main colour")


class WithLiteral(BaseModel):
    kind: Literal["user", "admin"]
    version: Literal[2]


class WithUnion(BaseModel):
    value: Union[conint(ge=0, le=100), constr(max_length=10), bool]


class Circle(BaseModel):
    type: Literal["circle"]
    radius: confloat(gt=0)


class Rect(BaseModel):
    type: Literal["rect"]
    w: confloat(ge=0)
    h: confloat(ge=0)


class WithDiscriminated(BaseModel):
    shape: Union[Circle, Rect] = Field(..., discriminator="type")


class WithSet(BaseModel):
    colors: Set[Color]
    levels: FrozenSet[Level] = frozenset()


class WithBoolSet(BaseModel):
    answers: Set[bool]


class WithFreeSet(BaseModel):
    tags: Set[constr(max_length=10)] = Field(..., max_items=1)


class ConstrainedNumbers(BaseModel):
    positive: conint(gt=0)
    small: conint(ge=-5, le=5)
    ratio: confloat(ge=0, le=1)
    rate: confloat(gt=0, le=0.25)
    price: confloat(gt=0, lt=1000)
    even: conint(multiple_of=2, ge=0, le=100)
    step: conint(multiple_of=10)
    big: conint(ge=-9223372036854775808, le=9223372036854775807)


class ConstrainedStrings(BaseModel):
    code: constr(min_length=2, max_length=6)
    sku: constr(regex=r"^[A-Z]{3}-\d{3}$")
    lower: constr(regex=r"^[a-z]+$", max_length=12) = "x"


class Dates(BaseModel):
    day: datetime.date
    at: datetime.datetime


class WithUUID(BaseModel):
    id: uuid.UUID
    parent: Optional[uuid.UUID] = None


class Misc(BaseModel):
    homepage: HttpUrl
    source: Optional[AnyUrl] = None
    host: ipaddress.IPv4Address
    when: datetime.time
    every: datetime.timedelta
    blob: conbytes(max_length=8) = b""
    amount: decimal.Decimal
    password: SecretStr = Field(..., max_length=12)


class WithDict(BaseModel):
    scores: Dict[constr(regex=r"^[a-z]{1,8}$"), conint(ge=0, le=100)]


class WithTuple(BaseModel):
    point: Tuple[float, float]
    entry: Tuple[constr(max_length=8), int, bool]


class WithConList(BaseModel):
    tags: conlist(constr(max_length=10), min_items=1, max_items=3)


class Node(BaseModel):
    value: conint(ge=0, le=9)
    children: List["Node"] = []


Node.update_forward_refs()


class Employee(BaseModel):
    name: constr(max_length=20)
    manager: Optional["Employee"] = None


Employee.update_forward_refs()


class Invoice(BaseModel):
    number: constr(regex=r"^INV-\d{4}$")
    issued: datetime.date
    due: Optional[datetime.date] = None
    customer: Person
    lines: conlist(Address, max_items=2) = []
    total: confloat(ge=0)
    paid: bool = False


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: confloat(ge=0.0, le=1.0)


class Extraction(BaseModel):
    people: List[Person] = Field(..., max_items=3)
    places: List[constr(max_length=20)] = Field(default_factory=list, max_items=3)


class ToolArgs(BaseModel):
    """Get the weather for a city."""
    city: constr(max_length=30) = Field(..., description="the city")
    unit: Literal["c", "f"] = "c"
    days: conint(ge=1, le=7) = 1


MODELS = {
    "person": Person, "person-optional": PersonOptional, "nested-address": WithAddress,
    "enum": WithEnum, "enum-described": WithEnumDescribed, "literal": WithLiteral,
    "union": WithUnion, "discriminated-union": WithDiscriminated, "set-enum": WithSet,
    "set-bool": WithBoolSet, "set-free": WithFreeSet, "constrained-numbers": ConstrainedNumbers,
    "constrained-strings": ConstrainedStrings, "dates": Dates, "uuid": WithUUID, "dict": WithDict,
    "tuple": WithTuple, "conlist": WithConList, "recursive-node": Node,
    "recursive-employee": Employee, "invoice": Invoice, "sentiment": Sentiment,
    "extraction": Extraction, "tool-args": ToolArgs, "misc-types": Misc,
}

if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent
    for name, model in MODELS.items():
        (out / f"pydantic1-{name}.json").write_text(json.dumps(model.schema(), indent=2) + "\n")
    print(f"{len(MODELS)} pydantic schemas in {out}")
