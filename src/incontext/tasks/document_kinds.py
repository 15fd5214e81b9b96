"""The eight kinds of everyday document the `documents` task writes (KINDS: meeting notes, a notice, a travel
itinerary, house or club rules, a product page, an e-mail or letter, a recipe, release notes), each a function of
invented names (`Names`: its own syllables) that returns the document's text and the facts it states."""

from __future__ import annotations
import datetime
import random
import re
from dataclasses import dataclass
from typing import Callable
from .facts import _RESERVED  # names other tasks train on, never drawn here


MAX_QUERIES = 10  # every document states at least MAX_QUERIES + 1 facts (one is the worked example)


@dataclass(frozen=True)
class Fact:
    relation: str  # what is asked, e.g. "chair", "amount" (of an ingredient): facts of one relation differ in key
    answer: str  # the span the question asks for, verbatim in the document once
    questions: tuple[str, ...]  # wordings of the question (one is drawn per episode); none contains the answer
    key: str = ""  # what a question names to ask for another ("flyers" in "Who will print the flyers?"): one fact a key


@dataclass(frozen=True)
class Document:
    kind: str
    text: str
    facts: tuple[Fact, ...]
    noun: str  # how a question names the document: "the notice" ("According to the notice, ...")


def occurrences(span: str, text: str) -> int:
    """How often `span` occurs in `text` as a whole span, case-insensitively: not inside a word, a number, a time
    (9:30), a price ($12), a decimal (4.6) or a version (2.4.1)."""
    return len(re.findall(rf"(?<![\w$#/-])(?<!\d[.:,]){re.escape(span)}(?![\w/-]|[.,:]\d)", text, flags=re.IGNORECASE))


_ONSETS = ("b", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "bl", "kl", "pr", "sl",
           "tr", "vr")


_NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "o", "ei", "ou")


_ENDS = ("", "", "", "", "k", "l", "n", "r", "s", "t")


_PLACE_ENDS = ("dale", "gate", "ley", "by", "thorpe", "combe", "wyn", "stow", "hurst", "field")


_FIRM_ENDS = ("Builders", "& Sons", "Works", "Brothers", "Supplies")


WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


COLOURS = ("red", "blue", "green", "yellow", "grey", "black", "white", "orange", "purple", "silver", "brown", "pink")


class Names:
    """One document's invented values: every value drawn is new to the document (case-insensitive), so no two
    facts share an answer; standalone numbers are new too (a count is never a date's day)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def fresh(self, make: Callable[[], str]) -> str:
        for _ in range(10_000):
            value = make()
            if value.lower() not in self.used:
                self.used.add(value.lower())
                return value
        raise ValueError("ran out of fresh values for one document")

    def one(self, *options):
        """A phrasing: any of `options` (not a value; may repeat)."""
        return self.rng.choice(options)

    def word(self, syllables: tuple[int, int] = (2, 2)) -> str:
        def make() -> str:
            while True:
                word = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_NUCLEI) + self.rng.choice(_ENDS)
                               for _ in range(self.rng.randint(*syllables)))
                if 4 <= len(word) <= 10 and word.lower() not in _RESERVED:
                    return word.capitalize()
        return self.fresh(make)

    def first(self) -> str:
        return self.word((2, 2))

    def person(self) -> str:
        return f"{self.first()} {self.word((2, 2))}"

    def place(self) -> str:
        return self.fresh(lambda: self.word((1, 1)) + self.rng.choice(_PLACE_ENDS))

    def firm(self) -> str:
        return self.fresh(lambda: f"{self.word((2, 2))} {self.rng.choice(_FIRM_ENDS)}")

    def number(self, low: int, high: int) -> str:
        return self.fresh(lambda: str(self.rng.randint(low, high)))

    def time(self, first_hour: int = 7, last_hour: int = 21) -> str:
        return self.fresh(lambda: f"{self.rng.randint(first_hour, last_hour)}:{self.rng.choice(('00', '15', '30', '45'))}")

    def price(self, low: int, high: int, cents: bool = False) -> str:
        return self.fresh(lambda: f"${self.rng.randint(low, high)}" + (f".{self.rng.choice(('50', '95', '99'))}" if cents else ""))

    def version(self, major: tuple[int, int] = (2, 9)) -> str:
        return self.fresh(lambda: f"{self.rng.randint(*major)}.{self.rng.randint(0, 12)}.{self.rng.randint(0, 9)}")

    def pick(self, pool: tuple[str, ...]) -> str:
        return self.fresh(lambda: self.rng.choice(pool))

    def days(self, n: int) -> list[str]:
        """n weekdays in a row, none drawn before in the document."""
        start = self.rng.choice([i for i in range(7) if not any(WEEKDAYS[(i + k) % 7].lower() in self.used for k in range(n))])
        days = [WEEKDAYS[(start + k) % 7] for k in range(n)]
        self.used.update(day.lower() for day in days)
        return days

    def date(self, after: datetime.date | None = None, days: tuple[int, int] = (1, 7)) -> tuple[str, str, datetime.date]:
        """(weekday, the date written out: "Tuesday 14 March", the date): a calendar date `days` after `after` (a
        day of a year at random without it) whose weekday and day of the month are new to the document."""
        for _ in range(10_000):
            if after is None:
                date = datetime.date(2030, 1, 1) + datetime.timedelta(self.rng.randrange(365))
            else:
                date = after + datetime.timedelta(self.rng.randint(*days))
            weekday, number = WEEKDAYS[date.weekday()], str(date.day)
            if weekday.lower() not in self.used and number not in self.used:
                self.used.update((weekday.lower(), number))
                return weekday, f"{weekday} {date.day} {MONTHS[date.month - 1]}", date
        raise ValueError("ran out of fresh dates for one document")


def _prose(*sentences: str) -> str:
    return " ".join(s for s in sentences if s)


def _bullets(rng: random.Random, items: list[str]) -> str:
    mark = rng.choice(("- ", "* ", "• "))
    return "\n".join(mark + item for item in items)


def _meeting_notes(d: Names):
    group = f"{d.place()} {d.one('Garden Society', 'Rowing Club', 'Residents Association', 'Choir', 'Film Club', 'Cycling Club')}"
    chair, clerk, absent = d.person(), d.person(), d.person()
    day, date, when = d.date()
    start, room, present = d.time(17, 20), d.word(), d.number(9, 40)
    event = d.one("summer fair", "autumn market", "open day", "quiz night", "winter concert")
    budget = d.price(150, 900)
    favour, against = d.number(11, 25), d.number(2, 8)
    proposal = d.one("move the meetings online", "raise the yearly fee", "buy a second shed", "start a newsletter")
    actions = [(d.first(), verb, d.pick(items)) for verb, items in (
        ("order", ("banners", "chairs", "name badges", "lanterns")), ("book", ("coach", "caterers", "marquee")),
        ("print", ("flyers", "posters", "raffle tickets", "programmes")))]
    due = d.pick(WEEKDAYS)
    next_day, next_date, _ = d.date(when, (14, 35))
    if d.rng.random() < 0.5:
        head = "\n".join([f"Minutes of the {group}", f"Date: {date}, {start}", f"Place: the {room} Room",
                          f"Chair: {chair}", f"Minutes: {clerk}", f"Present: {present} members. Apologies: {absent}."])
    else:
        head = _prose(f"Notes from the meeting of the {group}, held on {date} in the {room} Room.",
                      d.one(f"{chair} chaired the meeting, which opened at {start}, and {clerk} took the notes.",
                            f"The meeting opened at {start} with {chair} in the chair; {clerk} kept the minutes."),
                      d.one(f"{present} members attended and {absent} sent apologies.",
                            f"Attendance was {present}; apologies were received from {absent}."))
    body = _prose(d.one(f"The budget for the {event} was set at {budget}.",
                        f"Members agreed a budget of {budget} for the {event}."),
                  d.one(f"The proposal to {proposal} passed by {favour} votes to {against}.",
                        f"A vote on whether to {proposal} was carried, {favour} for and {against} against."))
    todo = [f"{who} to {verb} the {item}" + (f" by {due}" if i == 0 else "") for i, (who, verb, item) in enumerate(actions)]
    text = "\n\n".join([head, body, "Actions:\n" + _bullets(d.rng, todo), f"Next meeting: {next_date}."])
    first_who, first_verb, first_item = actions[0]
    facts = [Fact("chair", chair,
                  ("Who chaired the meeting?", "Who was the chair of the meeting?", "Which person led the meeting?")),
             Fact("minute-taker", clerk, ("Who took the minutes?", "Who wrote the notes of the meeting?")),
             Fact("meeting day", day,
                  ("On which day of the week was the meeting held?", "What day of the week did the members meet?")),
             Fact("start time", start, ("At what time did the meeting start?", "What time did the meeting open?")),
             Fact("room", room, ("In which room was the meeting held?", "Which room did the members meet in?")),
             Fact("attendance", present, ("How many members attended?", "How many members were present?")),
             Fact("apologies", absent, ("Who sent apologies?", "Which member was absent with apologies?")),
             Fact("budget", budget,
                  (f"What budget was set for the {event}?", f"How much money was agreed for the {event}?"), event),
             Fact("votes for", favour,
                  ("How many votes were cast for the proposal?", "How many members voted in favour?")),
             Fact("votes against", against,
                  ("How many votes were cast against the proposal?", "How many members voted against?"))]
    facts += [Fact("action owner", who,
                   (f"Who will {verb} the {item}?", f"Which member is to {verb} the {item}?"), item)
              for who, verb, item in actions]
    facts += [Fact("deadline", due, (f"By which day should {first_who} {first_verb} the {first_item}?",
                                     f"What is the deadline for {first_who} to {first_verb} the {first_item}?"), first_item),
              Fact("next meeting", next_day,
                   ("On which day of the week is the next meeting?", "What day is the next meeting?"))]
    return text, facts


def _notice(d: Names):
    building = d.one("Swimming Pool", "Library", "Community Hall", "Sports Centre", "Museum")
    facility, it = f"{d.place()} {building}", f"the {building.lower()}"
    close_day, close_date, closing = d.date()
    weeks = d.number(2, 9)
    open_day, open_date, _ = d.date(closing, (7 * int(weeks) + 1, 7 * int(weeks) + 6))
    repair, firm = d.pick(("boilers", "lifts", "floors", "windows", "gutters", "showers")), d.firm()
    hall, opens, closes = d.word(), d.time(8, 10), d.time(15, 19)
    contact, extension, manager = d.person(), d.number(2000, 8999), d.person()
    spaces, refund = d.number(10, 60), d.price(3, 20)
    title = d.one(f"NOTICE: {facility} closure", f"Important notice from the {facility}", f"{facility}: temporary closure")
    if d.rng.random() < 0.5:
        dates = f"Closed from: {close_date}\nReopening: {open_date}\nReason: work on the {repair}"
    else:
        dates = _prose(f"The {facility} will close on {close_date} while the {repair} are replaced.",
                       d.one(f"We expect to reopen on {open_date}.", f"It reopens on {open_date}."))
    body = _prose(d.one(f"The work will take about {weeks} weeks and is being done by {firm}.",
                        f"{firm} will carry out the work, which should last {weeks} weeks."),
                  d.one(f"Meanwhile a temporary desk in the {hall} Hall opens at {opens} and closes at {closes}.",
                        f"During the closure, the temporary desk in the {hall} Hall is open from {opens} to {closes}."),
                  d.one(f"Only {spaces} parking spaces stay open.", f"Parking is limited to {spaces} spaces."),
                  f"Members will receive {refund} off their next monthly fee.")
    footer = (d.one(f"Questions go to {contact} on extension {extension}.",
                    f"Please direct any questions to {contact} (extension {extension}).")
              + "\n" + d.one(f"Signed, {manager}, Manager", f"{manager}, Centre Manager"))
    text = "\n\n".join([title, dates, body, footer])
    facts = [Fact("closing day", close_day,
                  (f"On which day of the week does {it} close?", "What day does the closure begin?")),
             Fact("reopening day", open_day,
                  (f"On which day of the week does {it} reopen?", f"What day will {it} open again?")),
             Fact("repair", repair, ("What is being repaired?", f"Which part of {it} is the work on?")),
             Fact("duration", weeks, ("How many weeks will the work take?", "For how many weeks will the work last?")),
             Fact("firm", firm, ("Which firm is doing the work?", "Who is carrying out the work?")),
             Fact("temporary hall", hall, ("In which hall is the temporary desk?", "Where is the temporary desk?")),
             Fact("desk opens", opens,
                  ("At what time does the temporary desk open?", "When does the temporary desk open?")),
             Fact("desk closes", closes,
                  ("At what time does the temporary desk close?", "When does the temporary desk close?")),
             Fact("parking", spaces, ("How many parking spaces stay open?", "How many parking spaces are available?")),
             Fact("refund", refund,
                  ("How much will members receive off their next fee?", "What discount will members get on their next monthly fee?")),
             Fact("contact", contact, ("Who should questions go to?", "Who is the contact for questions?")),
             Fact("extension", extension,
                  (f"What is {contact}'s extension?", f"On which extension can {contact} be reached?"), contact),
             Fact("signatory", manager, ("Who signed the notice?", "Which manager wrote the notice?"))]
    return text, facts


def _itinerary(d: Names):
    region = d.place()
    meet, station, leave = d.time(7, 9), d.place(), d.time(10, 11)
    transport = d.one("coach", "ferry", "train")
    guide, hotels = d.person(), [d.word(), d.word()]
    days = d.days(3)
    sight = d.word()
    sight_kind = d.one("falls", "caves", "abbey", "gardens", "lighthouse")
    dinner, back = d.time(18, 20), d.time(15, 17)
    price, group, bag = d.price(300, 1200), d.number(8, 30), d.number(12, 25)
    title = d.one(f"Itinerary: three days in {region}", f"{region} tour - your itinerary", f"Your trip to {region}")
    plan = [f"{days[0]}: meet at {station} station at {meet}; the {transport} leaves at {leave}. "
            f"Night at Hotel {hotels[0]}.",
            f"{days[1]}: a guided walk to the {sight} {sight_kind}, then dinner at {dinner}. Night at the {hotels[1]} Inn.",
            f"{days[2]}: free morning; we arrive back at the station by {back}."]
    if d.rng.random() < 0.5:
        plan = [_bullets(d.rng, plan)]
    details = d.one(f"Guide: {guide}\nPrice: {price} per person\nGroup size: {group} travellers\nLuggage: one bag, at most {bag} kg",
                    _prose(f"Your guide is {guide}.", f"The trip costs {price} per person for a group of {group} travellers.",
                           f"Please bring one bag of no more than {bag} kg."))
    text = "\n\n".join([title, *plan, details])
    facts = [Fact("meeting time", meet,
                  ("At what time do the travellers meet on the first day?", "What time is the meeting on the first day?")),
             Fact("station", station,
                  ("At which station do the travellers meet?", "Where is the meeting point on the first day?")),
             Fact("departure", leave,
                  (f"At what time does the {transport} leave?", f"When does the {transport} depart?")),
             Fact("first hotel", hotels[0],
                  ("Which hotel do they stay at on the first night?", "In which hotel do they spend the first night?")),
             Fact("first day", days[0],
                  ("On which day does the trip start?", "What day of the week does the tour begin?")),
             Fact("sight day", days[1],
                  (f"On which day do they visit the {sight_kind}?", f"What day is the walk to the {sight_kind}?"), sight_kind),
             Fact("sight", sight,
                  (f"Which {sight_kind} do they walk to?", f"Which {sight_kind} does the guided walk visit?")),
             Fact("dinner", dinner,
                  ("At what time is dinner on the second day?", "What time is dinner after the walk?")),
             Fact("second hotel", hotels[1],
                  ("Which inn do they stay at on the second night?", "At which inn do they spend the second night?")),
             Fact("return day", days[2],
                  ("On which day does the trip end?", "What day of the week do they travel back?")),
             Fact("return time", back,
                  ("By what time do they arrive back?", "What time do they get back to the station?")),
             Fact("guide", guide, ("Who is the guide?", "Who leads the tour?")),
             Fact("price", price, ("How much does the trip cost per person?", "What is the price per person?")),
             Fact("group size", group, ("How many travellers are in the group?", "How large is the group?")),
             Fact("luggage", bag, ("How many kilograms may the bag weigh?", "What is the luggage limit in kg?"))]
    return text, facts


def _rules(d: Names):
    club = d.one(f"the {d.place()} Chess Club", f"{d.word()} House", f"the {d.place()} Tennis Club", f"the {d.word()} Allotments")
    quiet, kitchen = d.time(21, 23), d.time(19, 21)
    guests, fee, fine = d.number(2, 6), d.price(20, 90), d.price(2, 9)
    bin_day, keys = d.pick(WEEKDAYS), d.person()
    code, minutes = d.number(1000, 9999), d.pick(("45", "60", "90", "120"))
    password = d.fresh(lambda: d.word((2, 2)) + str(d.rng.randint(10, 99)))
    sorting = [(material, d.pick(COLOURS)) for material in d.rng.sample(("glass", "paper", "cans", "food waste"), 2)]
    secretary = d.person()
    title = d.one(f"Rules of {club}", f"{club[0].upper()}{club[1:]}: house rules", f"Please read: the rules of {club}")
    rules = [d.one(f"Quiet hours begin at {quiet}.", f"After {quiet} please keep noise down."),
             d.one(f"Each member may bring up to {guests} guests.", f"No more than {guests} guests per member."),
             d.one(f"Membership costs {fee} a year.", f"The yearly fee is {fee}."),
             d.one(f"The kitchen closes at {kitchen}.", f"Kitchen hours end at {kitchen}."),
             d.one(f"Books and equipment returned late cost {fine} a day.", f"Late returns are fined {fine} per day."),
             d.one(f"Bins go out on {bin_day} evening.", f"Put the bins out every {bin_day}."),
             *[d.one(f"{material.capitalize()} goes in the {colour} bin.", f"Use the {colour} bin for {material}.")
               for material, colour in sorting],
             d.one(f"Rooms can be booked for at most {minutes} minutes.", f"A booking lasts no longer than {minutes} minutes."),
             d.one(f"The door code is {code}; do not share it.", f"Door code: {code}."),
             d.one(f"The Wi-Fi password is {password}.", f"Wi-Fi: {password}"),
             d.one(f"Spare keys are held by {keys}.", f"{keys} keeps the spare keys.")]
    d.rng.shuffle(rules)
    text = "\n\n".join([title, _bullets(d.rng, rules) if d.rng.random() < 0.6 else _prose(*rules),
                        d.one(f"Complaints to the secretary, {secretary}.", f"Secretary: {secretary}")])
    facts = [Fact("quiet hours", quiet, ("At what time do quiet hours begin?", "When does the quiet time start?")),
             Fact("guests", guests,
                  ("How many guests may each member bring?", "What is the most guests a member may bring?")),
             Fact("fee", fee, ("How much does membership cost a year?", "What is the yearly fee?")),
             Fact("kitchen", kitchen, ("At what time does the kitchen close?", "When do kitchen hours end?")),
             Fact("fine", fine,
                  ("What is the fine per day for a late return?", "How much does a late return cost each day?")),
             Fact("bin day", bin_day, ("On which day do the bins go out?", "What day are the bins put out?")),
             *[Fact("bin colour", colour,
                    (f"Which bin does {material} go in?", f"What colour is the bin for {material}?"), material)
               for material, colour in sorting],
             Fact("booking", minutes,
                  ("For how many minutes can a room be booked?", "What is the longest booking in minutes?")),
             Fact("door code", code, ("What is the door code?", "Which code opens the door?")),
             Fact("password", password, ("What is the Wi-Fi password?", "Which password does the Wi-Fi use?")),
             Fact("keys", keys, ("Who holds the spare keys?", "Who keeps the spare keys?")),
             Fact("secretary", secretary, ("Who is the secretary?", "Who should complaints go to?"))]
    return text, sorted(facts, key=lambda fact: text.index(fact.answer))  # the text's order (the rules were shuffled)


def _product(d: Names):
    brand = d.word()
    d.used.add("5")  # "out of 5"
    model = f"{d.word((1, 2))} {d.number(2, 9)}"
    thing = d.one("bike light", "speaker", "camping lantern", "torch", "pair of headphones", "radio")
    price, was = d.price(25, 90, cents=True), d.price(100, 180)
    grams, hours, charge = d.number(150, 900), d.number(6, 40), d.number(41, 180)
    colours = [d.pick(COLOURS) for _ in range(3)]
    sold_out = d.pick(COLOURS)
    rating, buyers = d.fresh(lambda: f"{d.rng.randint(3, 4)}.{d.rng.randint(1, 9)}"), d.number(200, 990)
    delivery, warranty, maker, metres = d.number(2, 5), d.number(6, 9), d.place(), d.number(10, 40)
    expert = d.person()
    title = f"{brand} {model} {thing}"
    offer = d.one(f"Now {price} (was {was}).", f"Price: {price}, down from {was}.")
    specs = d.one(f"Weight: {grams} g\nBattery: up to {hours} hours\nCharging time: {charge} minutes",
                  _prose(f"It weighs just {grams} g and runs for up to {hours} hours on one charge.",
                         f"A full charge takes {charge} minutes."))
    stock = _prose(f"Available in {colours[0]}, {colours[1]} and {colours[2]}; the {sold_out} one is sold out.",
                   f"Designed in {maker}, with a warranty of {warranty} years.",
                   d.one(f"Water resistant to {metres} metres.", f"It survives {metres} metres under water."),
                   d.one(f"Rated {rating} out of 5 by {buyers} buyers.", f"Average rating {rating} ({buyers} reviews)."),
                   f"Delivered within {delivery} working days.",
                   f"Questions? Ask {expert}, our product expert.")
    text = "\n\n".join([title, offer, specs, stock])
    facts = [Fact("price", price, ("How much does it cost now?", "What is the current price?")),
             Fact("old price", was, ("What was the price before?", "What did it cost before the offer?")),
             Fact("weight", grams, ("How many grams does it weigh?", "What is its weight in grams?")),
             Fact("battery", hours,
                  ("For how many hours does the battery last?", "How many hours does it run on one charge?")),
             Fact("charging", charge,
                  ("How many minutes does a full charge take?", "What is the charging time in minutes?")),
             Fact("sold out", sold_out, ("Which colour is sold out?", "What colour can no longer be bought?")),
             Fact("maker", maker, ("Where was it designed?", "In which town was it designed?")),
             Fact("water", metres,
                  ("To how many metres is it water resistant?", "How many metres under water does it survive?")),
             Fact("warranty", warranty,
                  ("How many years of warranty does it have?", "How long is the warranty, in years?")),
             Fact("rating", rating, ("What is its average rating?", "What rating out of 5 does it have?")),
             Fact("buyers", buyers, ("How many buyers rated it?", "How many reviews does it have?")),
             Fact("delivery", delivery,
                  ("Within how many working days is it delivered?", "How many working days does delivery take?")),
             Fact("expert", expert, ("Who is the product expert?", "Who answers questions about it?")),
             Fact("brand", brand, (f"Which brand makes the {model}?", f"What is the brand of the {thing}?"), model)]
    return text, facts


def _letter(d: Names):
    sender, host = d.person(), d.person()
    reader = d.first()
    event = d.one("street picnic", "book swap", "retirement party", "garden concert", "quiz evening")
    day, date, _ = d.date()
    start, venue = d.time(12, 19), d.word()
    place_kind = d.one("Tavern", "Park", "Hall", "Gardens")
    bring = d.pick(("lemonade", "napkins", "cushions", "candles", "biscuits", "bread", "cheese", "plates"))
    guests, ticket, bus = d.number(15, 80), d.price(4, 25), d.number(30, 99)
    street, reply_day, wear = d.word(), d.pick(WEEKDAYS), d.pick(COLOURS)
    collector = d.person()
    invite = _prose(d.one(f"You are invited to the {event} on {date} at {start}, at the {venue} {place_kind}.",
                          f"The {event} takes place at the {venue} {place_kind} on {date}, starting at {start}."),
                    d.one(f"We expect about {guests} guests, and tickets are {ticket} each.",
                          f"Tickets cost {ticket}; around {guests} people are coming."),
                    d.one(f"Could you bring some {bring}?", f"It would help if you brought {bring}."),
                    d.one(f"The number {bus} bus stops outside, and you can park on {street} Street.",
                          f"Parking is on {street} Street; bus {bus} stops at the door."),
                    d.one(f"Wear something {wear} if you can: it is the colour of the day.", f"The colour of the day is {wear}."),
                    f"{collector} is collecting money for a gift.")
    reply = d.one(f"Please reply to {host} by {reply_day}.", f"Let {host} know by {reply_day} whether you can come.")
    if d.rng.random() < 0.5:
        noun = "the e-mail"
        text = "\n\n".join([f"From: {sender}\nTo: {reader}\nSubject: the {event}", d.one("Hi,", "Hello,"),
                            invite, reply, d.one("Thanks,", "Cheers,") + f"\n{sender.split()[0]}"])
    else:
        noun = "the letter"
        text = "\n\n".join([f"Dear {reader},", invite, reply, d.one("Best wishes,", "Yours,", "Warmly,") + f"\n{sender}"])
    facts = [Fact("reader", reader, (f"Who is {noun} written to?", "Who is being invited?")),
             Fact("event day", day, (f"On which day of the week is the {event}?", f"What day is the {event}?")),
             Fact("start", start, (f"At what time does the {event} start?", f"When does the {event} begin?")),
             Fact("venue", venue, (f"At which {place_kind.lower()} does it take place?",
                                   f"Which {place_kind.lower()} is the {event} at?")),
             Fact("guests", guests, ("How many guests are expected?", "About how many people are coming?")),
             Fact("ticket", ticket, ("How much is a ticket?", "What does a ticket cost?")),
             Fact("bring", bring, ("What is the reader asked to bring?", "What should the guest bring?")),
             Fact("bus", bus, ("Which bus stops outside?", "What is the number of the bus?")),
             Fact("street", street, ("On which street can guests park?", "Where can guests park?")),
             Fact("theme", wear, ("What colour should guests wear?", "What is the colour of the theme?")),
             Fact("collector", collector, ("Who is collecting money for a gift?", "Who is collecting for the gift?")),
             Fact("reply to", host, ("Who should the reply go to?", "Who should be told whether the reader can come?")),
             Fact("reply by", reply_day, ("By which day should the reader reply?", "What is the day to reply by?")),
             Fact("sender", sender, (f"Who wrote {noun}?", f"Who signed {noun}?"))]
    return text, facts, noun


def _recipe(d: Names):
    dish = f"{d.word()} {d.one('stew', 'flatbread', 'soup', 'pie', 'pancakes', 'bake')}"
    cook = d.person()
    serves, prep, bake = d.number(2, 8), d.number(10, 25), d.number(26, 70)
    degrees = d.pick(("160", "170", "180", "190", "200", "220"))
    ingredients = [(d.pick(("flour", "butter", "sugar", "rice", "lentils", "oats", "cheese", "spinach", "beans", "carrots")),
                    d.number(100, 600), d.one("g", "grams of")) for _ in range(3)]
    milk, veg = d.number(150, 500), d.pick(("onions", "leeks", "mushrooms", "peppers", "shallots"))
    spice = d.pick(("cumin", "paprika", "nutmeg", "thyme", "ginger", "dill", "basil"))
    side = d.pick(("yogurt", "pickles", "salad", "bread"))
    fry, keeps = d.number(3, 9), d.number(2, 5)
    title = d.one(f"{dish} (from the kitchen of {cook})", f"{dish}\nA recipe by {cook}")
    head = d.one(f"Serves {serves}. Preparation: {prep} minutes.", f"Serves: {serves}\nPrep time: {prep} minutes")
    listed = [f"{amount} {unit} {name}" for name, amount, unit in ingredients]
    listed += [f"{milk} ml milk", f"{veg}, chopped", f"a pinch of {spice}"]
    steps = _prose(f"Heat the oven to {degrees} degrees.",
                   d.one(f"Fry the {veg} gently for {fry} minutes,", f"Soften the {veg} for {fry} minutes,")
                   + f" then stir in the rest with the milk.",
                   d.one(f"Bake for {bake} minutes until golden.", f"Put it in the oven for {bake} minutes."),
                   d.one(f"Serve with {side}.", f"Best served with {side}."),
                   f"It keeps for {keeps} days in the fridge.")
    text = "\n\n".join([title, head, "Ingredients:\n" + _bullets(d.rng, listed), steps])
    facts = [Fact("cook", cook, ("Whose recipe is this?", "Who wrote the recipe?")),
             Fact("serves", serves, ("How many people does it serve?", "For how many people is the recipe?")),
             Fact("preparation", prep,
                  ("How many minutes does the preparation take?", "What is the preparation time in minutes?"))]
    facts += [Fact("amount", amount,
                   (f"How many grams of {name} does it need?", f"What amount of {name} is used, in grams?"), name)
              for name, amount, _ in ingredients]
    facts += [Fact("milk", milk, ("How many millilitres of milk does it need?", "How much milk goes in, in ml?")),
              Fact("spice", spice, ("Which spice is added?", "Which spice goes in?")),
              Fact("oven", degrees,
                   ("At what temperature should the oven be set?", "To how many degrees is the oven heated?")),
              Fact("frying", fry,
                   (f"For how many minutes are the {veg} cooked?", f"How long are the {veg} fried, in minutes?"), veg),
              Fact("baking", bake, ("How many minutes does it bake?", "For how many minutes does it go in the oven?")),
              Fact("side", side, ("What should it be served with?", "What goes with it?")),
              Fact("keeps", keeps, ("For how many days does it keep in the fridge?", "How many days does it keep?"))]
    return text, facts


def _release_notes(d: Names):
    app = d.word()
    version, previous, removal = d.version((4, 9)), d.version((2, 3)), d.version((10, 12))
    day, date, _ = d.date()
    mode, setting = d.word().lower(), d.word().lower()
    issue, memory, size = d.number(1000, 9999), d.number(4, 16), d.number(40, 400)
    faster, languages = d.number(20, 60), d.number(17, 39)
    thanks, reporter = d.person(), d.person()
    title = d.one(f"{app} {version} release notes", f"What's new in {app} {version}")
    intro = d.one(f"Released on {date}. You can upgrade directly from {previous}.",
                  f"Release date: {date}\nUpgrade from: {previous} or later")
    changes = [d.one(f"New: a {mode} mode for working offline.", f"Added {mode} mode, which works offline."),
               f"Fixed a crash when opening large files (issue {issue}, reported by {reporter}).",
               d.one(f"Start-up is {faster} percent faster.", f"Starts {faster} percent faster than before."),
               f"The interface is now translated into {languages} languages.",
               f"The {setting} setting is deprecated and will be removed in {removal}."]
    needs = d.one(f"Requirements: at least {memory} GB of memory. Download size: {size} MB.",
                  f"It now needs {memory} GB of memory, and the download is {size} MB.")
    text = "\n\n".join([title, intro, "Changes:\n" + _bullets(d.rng, changes), needs,
                        d.one(f"Thanks to {thanks} for the new mode.", f"Special thanks: {thanks}, who wrote the new mode.")])
    facts = [Fact("version", version,
                  (f"What is the version number of this {app} release?", "Which version do these notes describe?")),
             Fact("release day", day, ("On which day of the week was it released?", "What day was the release?")),
             Fact("upgrade from", previous,
                  ("From which version can users upgrade directly?", "What is the earliest version to upgrade from?")),
             Fact("new mode", mode, ("What is the new mode called?", "Which mode was added?")),
             Fact("issue", issue,
                  ("Which issue number was the crash?", "What is the number of the issue that was fixed?")),
             Fact("reporter", reporter, ("Who reported the crash?", "Who found the crash with large files?")),
             Fact("speed", faster,
                  ("By how many percent is start-up faster?", "How many percent faster does it start?")),
             Fact("languages", languages,
                  ("Into how many languages is the interface translated?", "How many languages are there now?")),
             Fact("deprecated", setting, ("Which setting is deprecated?", "What setting will be removed?")),
             Fact("removal", removal,
                  ("In which version will the deprecated setting be removed?", "When is the old setting removed, by version?")),
             Fact("memory", memory, ("How many GB of memory does it need?", "What is the memory requirement in GB?")),
             Fact("download", size, ("How many MB is the download?", "What is the download size in MB?")),
             Fact("thanks", thanks, ("Who is thanked for the new mode?", "Who wrote the new mode?"))]
    return text, facts


# kind -> (writer, how a question names the document); the letter names itself (an e-mail or a letter)
KINDS: dict[str, tuple[Callable, str]] = {
    "meeting-notes": (_meeting_notes, "the meeting notes"),
    "notice": (_notice, "the notice"),
    "itinerary": (_itinerary, "the itinerary"),
    "rules": (_rules, "the rules"),
    "product-page": (_product, "the product page"),
    "letter": (_letter, "the letter"),
    "recipe": (_recipe, "the recipe"),
    "release-notes": (_release_notes, "the release notes"),
}
