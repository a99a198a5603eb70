#!/usr/bin/python3
"""Generate Molly's labelled redaction corpus.

This script is deliberately independent of the Go detectors: it never
imports, calls or copies them. Values and their check digits come from
published sources and from python-stdnum (Debian: python3-stdnum), which
implements the published algorithms:

  * IBAN: BBAN structures of the SWIFT IBAN registry (stdnum's iban.dat),
    check digits by ISO 7064 MOD 97-10 (stdnum.iban.calc_check_digits),
    plus the registry's own example IBANs;
  * payment cards: issuers' published test card numbers, and random PANs
    in published IIN ranges with a Luhn check digit (stdnum.luhn);
  * US SSN: numbers valid per stdnum.us.ssn (SSA rules), near-misses from
    the published never-issued ranges (000, 666, 9xx areas, 00 group,
    0000 serial) and the SSA's voided advertising numbers;
  * Italian fiscal codes: stdnum.it.codicefiscale check character;
  * phone numbers: the ITU-T E.164 national numbering plans of IT (AGCOM),
    GB (Ofcom), US (NANPA fictional 555-01xx and real area codes),
    FR (ARCEP), DE (BNetzA) and ES (CNMC): prefixes and lengths;
  * person names: Python Faker (Debian: python3-fake-factory) locale
    name lists, plus names written by hand in this file.

Every value is written into the text with a label in markup:
    \u27e6TYPE:evasion|value\u27e7
(evasion "plain" when the value is written normally). The Go test strips
the markup and keeps the byte spans. Split values carry "#group" after the
evasion and appear in several segments of one item.

Usage: gen.py SEED OUT.jsonl [N]
"""
import base64
import os
import json
import random
import sys

import stdnum.iban
import stdnum.luhn
import stdnum.us.ssn
import stdnum.it.codicefiscale
from faker import Faker

L, R = "\u27e6", "\u27e7"


def lab(typ, value, ev="plain"):
    assert L not in value and R not in value
    return f"{L}{typ}:{ev}|{value}{R}"


# ---------------------------------------------------------------- values

# Published examples of the SWIFT IBAN registry (one per country).
REGISTRY_IBANS = [
    "AD1200012030200359100100", "AT611904300234573201", "BE68539007547034",
    "BG80BNBG96611020345678", "CH9300762011623852957", "CY17002001280000001200527600",
    "CZ6508000000192000145399", "DE89370400440532013000", "DK5000400440116243",
    "EE382200221020145685", "ES9121000418450200051332", "FI2112345600000785",
    "FR1420041010050500013M02606", "GB29NWBK60161331926819", "GR1601101250000000012300695",
    "HR1210010051863000160", "HU42117730161111101800000000", "IE29AIBK93115212345678",
    "IS140159260076545510730339", "IT60X0542811101000000123456", "LI21088100002324013AA",
    "LT121000011101001000", "LU280019400644750000", "LV80BANK0000435195001",
    "MT84MALT011000012345MTLCAST001S", "NL91ABNA0417164300", "NO9386011117947",
    "PL61109010140000071219812874", "PT50000201231234567890154", "RO49AAAA1B31007593840000",
    "SE4550000000058398257466", "SI56263300012039086", "SK3112000000198742637541",
    "SM86U0322509800000000270100", "MC5811222000010123456789030",
]

IBAN_STRUCT = {}
for line in open(os.path.join(os.path.dirname(os.path.dirname(stdnum.iban.__file__)), "stdnum", "iban.dat")):
    line = line.strip()
    if not line or line.startswith("#") or line[0] == " ":
        continue
    cc = line[:2]
    if 'bban="' in line:
        IBAN_STRUCT[cc] = line.split('bban="')[1].split('"')[0]

COMMON_IBAN_CC = ["IT", "DE", "FR", "ES", "GB", "NL", "BE", "AT", "CH", "PT", "IE", "PL", "SE", "LU", "SM"]

# Issuers' published test card numbers (Visa, Mastercard, Amex, Discover,
# Diners, JCB, UnionPay as published by card networks and acquirers).
TEST_CARDS = [
    "4111111111111111", "4012888888881881", "4222222222222", "4242424242424242",
    "4000056655665556", "5555555555554444", "5105105105105100", "5200828282828210",
    "2223000048400011", "2222405343248877", "378282246310005", "371449635398431",
    "378734493671000", "6011111111111117", "6011000990139424", "6011981111111113",
    "30569309025904", "38520000023237", "3530111333300000", "3566002020360505",
    "6200000000000005", "36227206271667",
]

CARD_IIN = [  # (prefix, length) from the networks' published IIN ranges
    ("4", 16), ("4", 16), ("4", 13), ("51", 16), ("52", 16), ("53", 16), ("54", 16),
    ("55", 16), ("2221", 16), ("2720", 16), ("34", 15), ("37", 15), ("6011", 16),
    ("65", 16), ("3528", 16), ("3589", 16), ("36", 14), ("62", 16),
]


def _iban_ok(v):
    # MOD 97-10 only: national check digits (ES, FR, IT, ...) are not what
    # the registry's IBAN check is about.
    try:
        stdnum.iban.validate(v, check_country=False)
        return True
    except stdnum.iban.ValidationError:
        return False


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.fakers = {}
        for loc in ["it_IT", "en_US", "fr_FR", "de_DE", "es_ES"]:
            f = Faker(loc)
            f.seed_instance(seed) if hasattr(f, "seed_instance") else f.seed(seed)
            self.fakers[loc[:2]] = f

    def digits(self, n):
        return "".join(self.r.choice("0123456789") for _ in range(n))

    def pick(self, xs):
        return self.r.choice(xs)

    # --- cards
    def card(self, valid=True):
        if valid and self.r.random() < 0.35:
            return self.pick(TEST_CARDS)
        pfx, n = self.pick(CARD_IIN)
        body = pfx + self.digits(n - len(pfx) - 1)
        c = stdnum.luhn.calc_check_digit(body)
        if not valid:
            c = str((int(c) + self.r.randint(1, 9)) % 10)
        return body + c

    def group_card(self, d, sep=" "):
        if len(d) == 15:
            return d[:4] + sep + d[4:10] + sep + d[10:]
        if len(d) == 14:
            return d[:4] + sep + d[4:10] + sep + d[10:]
        return sep.join(d[i:i + 4] for i in range(0, len(d), 4))

    # --- IBAN
    def iban(self, valid=True):
        if valid and self.r.random() < 0.3:
            return self.pick(REGISTRY_IBANS)
        cc = self.pick(COMMON_IBAN_CC) if self.r.random() < 0.8 else self.pick(sorted(IBAN_STRUCT))
        bban = ""
        spec = IBAN_STRUCT[cc]
        i = 0
        while i < len(spec):
            j = i
            while spec[j].isdigit():
                j += 1
            n = int(spec[i:j])
            kind = spec[j + 1] if spec[j] == "!" else spec[j]
            i = j + (2 if spec[j] == "!" else 1)
            alpha = {"n": "0123456789", "a": "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                     "c": "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", "e": " "}[kind]
            bban += "".join(self.r.choice(alpha) for _ in range(n))
        cd = stdnum.iban.calc_check_digits(cc + "00" + bban)
        if not valid:
            cd = "%02d" % ((int(cd) + self.r.randint(1, 50)) % 97 + 2)
            if _iban_ok(cc + cd + bban):
                cd = "%02d" % ((int(cd) + 1) % 97 + 2)
        v = cc + cd + bban
        assert _iban_ok(v) == valid, v
        return v

    def paper(self, v):
        return " ".join(v[i:i + 4] for i in range(0, len(v), 4))

    # --- SSN
    def ssn(self, valid=True):
        while True:
            if valid:
                s = "%03d%02d%04d" % (self.r.randint(1, 899), self.r.randint(1, 99), self.r.randint(1, 9999))
            else:
                kind = self.r.randrange(5)
                a, g, sr = "%03d" % self.r.randint(1, 665), "%02d" % self.r.randint(1, 99), "%04d" % self.r.randint(1, 9999)
                if kind == 0:
                    a = "000"
                elif kind == 1:
                    a = "666"
                elif kind == 2:
                    a = "9%02d" % self.r.randint(0, 99)
                elif kind == 3:
                    g = "00"
                else:
                    sr = "0000"
                s = a + g + sr
            if stdnum.us.ssn.is_valid(s) == valid and s not in ("078051120", "219099999", "123456789"):
                return s

    # --- fiscal code
    def fiscal(self, valid=True):
        L_ = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        cons = "BCDFGHJKLMNPQRSTVWXYZ"
        day = self.r.randint(1, 28) + (40 if self.r.random() < 0.5 else 0)
        body = "".join(self.r.choice(cons) for _ in range(3)) + "".join(self.r.choice(L_) for _ in range(3))
        body += self.digits(2) + self.r.choice("ABCDEHLMPRST") + "%02d" % day
        body += self.r.choice("ABCDEFGHILM") + self.digits(3)
        c = stdnum.it.codicefiscale.calc_check_digit(body)
        if not valid:
            c = L_[(L_.index(c) + self.r.randint(1, 25)) % 26]
        return body + c

    # --- phones, from national numbering plans
    def phone(self):
        k = self.r.randrange(10)
        it_mob = ["320", "324", "327", "328", "329", "330", "331", "333", "334", "335", "336", "337", "338", "339",
                  "340", "342", "345", "346", "347", "348", "349", "350", "351", "366", "368", "380", "388", "389",
                  "391", "392", "393"]
        if k == 0:
            return ("it_mobile_intl", "+39 " + self.pick(it_mob) + " " + self.digits(3) + " " + self.digits(4))
        if k == 1:
            return ("it_mobile", self.pick(it_mob) + " " + self.digits(3) + " " + self.digits(4))
        if k == 2:
            return ("it_mobile_bare", self.pick(it_mob) + self.digits(7))
        if k == 3:
            return ("it_landline", self.pick(["02", "06", "011", "055", "051", "081"]) + " " + self.digits(4) + " " + self.digits(4)[:4 if self.r.random() < 0.5 else 3])
        if k == 4:
            return ("gb", "+44 7" + self.pick(["400", "700", "800", "900", "500"])[0:3] + " " + self.digits(6))
        if k == 5:
            area = self.pick(["212", "415", "617", "312", "646", "202", "305", "206"])
            return ("us", "+1 " + area + "-" + self.pick("23456789") + self.digits(2) + "-" + self.digits(4))
        if k == 6:
            area = self.pick(["212", "415", "617", "312", "646", "202"])
            return ("us_nat", "(" + area + ") " + self.pick("23456789") + self.digits(2) + "-" + self.digits(4))
        if k == 7:
            d = self.pick(["6", "7"]) + self.digits(8)
            return ("fr", "+33 " + d[0] + " " + " ".join(d[i:i + 2] for i in range(1, 9, 2)))
        if k == 8:
            return ("de", "+49 " + self.pick(["151", "160", "170", "171", "175", "152"]) + " " + self.digits(7))
        return ("es", "+34 " + self.pick(["6", "7"]) + self.digits(2) + " " + self.digits(3) + " " + self.digits(3))

    # --- e-mail
    def email(self, lang):
        f = self.fakers[lang]
        first, last = f.first_name().lower(), f.last_name().lower()
        first = "".join(c for c in first if c.isascii() and c.isalpha()) or "anna"
        last = "".join(c for c in last if c.isascii() and c.isalpha()) or "rossi"
        sep = self.pick([".", "_", "-", ""])
        local = first + sep + last
        if self.r.random() < 0.3:
            local += self.digits(2)
        dom = self.pick(["example.org", "example.com", "example.it", "example.net", "mail.example.co.uk",
                         "azienda-example.it", "example.fr", "example.de", "example.es", "uni.example.edu"])
        return local, dom

    def ip(self):
        k = self.r.randrange(5)
        if k == 0:
            return "2001:db8:%x::%x" % (self.r.randint(1, 0xffff), self.r.randint(1, 0xffff))
        if k == 1:
            return "10.%d.%d.%d" % (self.r.randint(0, 255), self.r.randint(0, 255), self.r.randint(1, 254))
        if k == 2:
            return "192.168.%d.%d" % (self.r.randint(0, 255), self.r.randint(1, 254))
        return "%d.%d.%d.%d" % (self.pick([8, 34, 51, 81, 151, 185, 203]), self.r.randint(0, 255), self.r.randint(0, 255), self.r.randint(1, 254))

    def rs(self, n, alpha="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"):
        return "".join(self.r.choice(alpha) for _ in range(n))

    def secret(self):
        # Key formats as the providers document them.
        k = self.r.randrange(11)
        if k == 0:
            return "sk-proj-" + self.rs(48) + "T3BlbkFJ" + self.rs(48)
        if k == 1:
            return "sk-ant-api03-" + self.rs(93, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") + "AA"
        if k == 2:
            return "AKIA" + self.rs(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
        if k == 3:
            return "ghp_" + self.rs(36)
        if k == 4:
            return "xoxb-" + self.digits(12) + "-" + self.digits(13) + "-" + self.rs(24)
        if k == 5:
            return "sk_live_" + self.rs(24)
        if k == 6:
            return "AIza" + self.rs(35, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        if k == 7:
            return "github_pat_" + self.rs(22) + "_" + self.rs(59)
        if k == 8:
            hdr = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
            pl = base64.urlsafe_b64encode(json.dumps({"sub": self.digits(8), "name": "x" + self.rs(6), "iat": int(self.digits(9)) + 1500000000}).encode()).decode().rstrip("=")
            return hdr + "." + pl + "." + self.rs(43, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        if k == 9:
            body = "\n".join(self.rs(64, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(3))
            return "-----BEGIN RSA PRIVATE KEY-----\n" + body + "\n-----END RSA PRIVATE KEY-----"
        return "glpat-" + self.rs(20, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")

    def person(self, lang):
        f = self.fakers[lang]
        return f.first_name() + " " + f.last_name()


# ------------------------------------------------------------ evasions

DIGIT_SETS = {"arabic_indic": 0x0660, "devanagari": 0x0966, "fullwidth": 0xFF10, "bengali": 0x09E6, "extended_arabic": 0x06F0}


def sep_every(v, sep):
    return sep.join(v)


def unicode_digits(r, v, all_digits=False):
    base = DIGIT_SETS[r.choice(sorted(DIGIT_SETS))]
    out = []
    for c in v:
        if c.isdigit() and c.isascii() and (all_digits or r.random() < 0.5):
            out.append(chr(base + int(c)))
        else:
            out.append(c)
    return "".join(out)


def mixed_groups(r, v, seps):
    groups = [v[i:i + 4] for i in range(0, len(v), 4)]
    out = groups[0]
    for g in groups[1:]:
        out += r.choice(seps) + g
    return out


def numeric_evasion(r, v):
    """v: compact digits (or IBAN compact). Returns (evasion, text)."""
    k = r.randrange(11)
    if k == 0:
        return "spaced", sep_every(v, " ")
    if k == 1:
        return "newline_sep", sep_every(v, "\n") if r.random() < 0.5 else mixed_groups(r, v, ["\n"])
    if k == 2:
        return "dot_sep", sep_every(v, ".") if r.random() < 0.5 else mixed_groups(r, v, ["."])
    if k == 3:
        return "slash_sep", sep_every(v, "/") if r.random() < 0.5 else mixed_groups(r, v, ["/"])
    if k == 4:
        return "plus_sep", sep_every(v, "+") if r.random() < 0.5 else mixed_groups(r, v, ["+"])
    if k == 5:
        return "underscore_sep", sep_every(v, "_") if r.random() < 0.5 else mixed_groups(r, v, ["_"])
    if k == 6:
        return "pct20_sep", sep_every(v, "%20") if r.random() < 0.5 else mixed_groups(r, v, ["%20"])
    if k == 7:
        return "mixed_sep", mixed_groups(r, v, [" ", "-", ".", "/", "_"])
    if k == 8:
        return "doubled_sep", mixed_groups(r, v, ["  ", "--", "..", " - ", "//"])
    if k == 9:
        return "unicode_digits", unicode_digits(r, v)
    return "unicode_digits", unicode_digits(r, v, True)


HOMO = {"a": ["\u0251", "\u0430"], "o": ["\u043e", "\u03bf"], "e": ["\u0435"], "c": ["\u0441"], "p": ["\u0440"], "i": ["\u0456"]}


def email_evasion(r, local, dom):
    k = r.randrange(12)
    plain = local + "@" + dom
    if k == 0:
        loc = local.replace(".", " dot ")
        return "written_out", loc + " at " + dom.replace(".", " dot ")
    if k == 1:
        return "written_out", local + r.choice([" at ", " AT "]) + dom.replace(".", r.choice([" dot ", " DOT "]))
    if k == 2:
        return "bracket_at", local + r.choice(["[at]", " [at] ", "(at)", " (at) ", "{at}"]) + dom
    if k == 3:
        return "bracket_at", local + r.choice([" [at] ", " (at) "]) + dom.replace(".", r.choice([" [dot] ", " (dot) ", "[dot]"]))
    if k == 4:
        return "html_entity", plain.replace("@", r.choice(["&#64;", "&commat;", "&#x40;"]))
    if k == 5:
        return "html_entity", plain.replace("@", "&#64;").replace(".", r.choice(["&#46;", "&period;", "."]))
    if k == 6:
        return "percent_all", "".join("%%%02X" % ord(c) for c in plain)
    if k == 7:
        i = r.randrange(1, len(local))
        return "combining", local[:i] + r.choice(["\u0301", "\u0300", "\u0308", "\u0327"]) + local[i:] + "@" + dom
    if k == 8:
        cands = [i for i, c in enumerate(plain) if c in HOMO]
        if not cands:
            return "plain", plain
        s = list(plain)
        for i in r.sample(cands, min(len(cands), r.randint(1, 2))):
            s[i] = r.choice(HOMO[s[i]])
        return "homoglyph", "".join(s)
    if k == 9:
        return "fullwidth", "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in plain)
    if k == 10:
        i = r.randrange(1, len(plain))
        return "zero_width", plain[:i] + r.choice(["\u200b", "\u200d", "\u2060", "\u00ad"]) + plain[i:]
    return "percent_at", plain.replace("@", "%40")


def encode_evasion(r, text):
    k = r.randrange(6)
    b = text.encode()
    if k == 0:
        return "base64", base64.b64encode(b).decode()
    if k == 1:
        return "base64_url", base64.urlsafe_b64encode(b).decode().rstrip("=")
    if k == 2:
        return "base64_double", base64.b64encode(base64.b64encode(b)).decode()
    if k == 3:
        s = base64.b64encode(b).decode()
        w = r.choice([16, 20, 24, 32])
        return "base64_wrapped", "\n".join(s[i:i + w] for i in range(0, len(s), w))
    if k == 4:
        return "hex", b.hex()
    return "hex_spaced", " ".join("%02x" % c for c in b) if r.random() < 0.7 else ":".join("%02X" % c for c in b)


# ------------------------------------------------------------ templates

T = {
    "en": ["Hi, please contact me at {v}, thanks.", "Can you check {v} for me? It's urgent.",
           "Here are the details: {v}; let me know.", "Send the invoice to {v}.",
           "My data: {v} (please keep it private).", "Note for the file - {v} - to be verified.",
           "The customer wrote {v} in the form.", "Please update the record with {v} before Friday."],
    "it": ["Ciao, contattami pure a {v}, grazie.", "Il dato che ti serve è {v}, fammi sapere.",
           "Ecco i dettagli: {v}; a presto.", "Per favore usa {v} per il pagamento.",
           "I miei dati ({v}) sono riservati.", "Nel modulo il cliente ha scritto {v}.",
           "Aggiorna la scheda con {v} entro venerdì."],
    "fr": ["Bonjour, voici mes coordonnées : {v}. Merci.", "Pouvez-vous vérifier {v} ?",
           "Le client a indiqué {v} dans le formulaire.", "Merci d'utiliser {v} pour le paiement.",
           "Mes données ({v}) sont confidentielles."],
    "de": ["Hallo, hier meine Angaben: {v}. Danke.", "Können Sie {v} bitte prüfen?",
           "Der Kunde hat {v} im Formular angegeben.", "Bitte verwenden Sie {v} für die Zahlung.",
           "Meine Daten ({v}) sind vertraulich."],
    "es": ["Hola, estos son mis datos: {v}. Gracias.", "¿Puedes comprobar {v}?",
           "El cliente escribió {v} en el formulario.", "Por favor, usa {v} para el pago.",
           "Mis datos ({v}) son confidenciales."],
}

CTX = {
    "PHONE": {"en": "my phone number is ", "it": "il mio numero è ", "fr": "mon numéro est le ", "de": "meine Nummer ist ", "es": "mi teléfono es "},
    "US_SSN": {"en": "SSN ", "it": "SSN ", "fr": "SSN ", "de": "SSN ", "es": "SSN "},
    "PERSON_PRE": {"en": ["My name is ", "Dear ", "Mr. ", "Ms. ", "Dr. ", "I am "],
                   "it": ["Mi chiamo ", "Gentile ", "Sig. ", "Dott.ssa ", "Caro "],
                   "fr": ["Je m'appelle ", "Cher ", "M. ", "Mme ", "Bonjour "],
                   "de": ["Ich heiße ", "Sehr geehrte Frau ", "Herr ", "Lieber ", "Dr. "],
                   "es": ["Me llamo ", "Estimado ", "Sr. ", "Sra. ", "Hola "]},
}

NEAR = [
    lambda g: "Order ORD-2024-%s shipped on 2024-0%d-1%d." % (g.digits(6), g.r.randint(1, 9), g.r.randint(0, 9)),
    lambda g: "Ordine n. %s del %02d/%02d/20%02d." % (g.digits(8), g.r.randint(1, 28), g.r.randint(1, 12), g.r.randint(0, 30)),
    lambda g: "Version %d.%d.%d.%d of the firmware fixes it." % (g.r.randint(1, 20), g.r.randint(0, 20), g.r.randint(0, 9), g.r.randint(0, 99)),
    lambda g: "Upgrade to v%d.%d.%d (build %d.%d.%d.%d)." % (g.r.randint(0, 9), g.r.randint(0, 30), g.r.randint(0, 99), g.r.randint(1, 9), g.r.randint(0, 9), g.r.randint(0, 9), g.r.randint(100, 9999)),
    lambda g: "Versione %d.%d.%d.%d rilasciata ieri." % (g.r.randint(1, 20), g.r.randint(0, 20), g.r.randint(0, 9), g.r.randint(0, 99)),
    lambda g: "This card was declined: %s." % g.group_card(g.card(False), g.pick([" ", "-", ""])),
    lambda g: "IBAN sbagliato: %s." % g.paper(g.iban(False)),
    lambda g: "Test SSN %s-%s-%s is not real." % ((lambda s: (s[:3], s[3:5], s[5:]))(g.ssn(False))),
    lambda g: "Codice fiscale errato %s." % g.fiscal(False),
    lambda g: "Totale € %d.%03d,%02d; sconto %d%%." % (g.r.randint(1, 99), g.r.randint(0, 999), g.r.randint(0, 99), g.r.randint(1, 50)),
    lambda g: "Ticket #%s, customer id %s, invoice INV-%s." % (g.digits(7), g.digits(9), g.digits(5)),
    lambda g: "Timestamp 2024-%02d-%02dT%02d:%02d:%02d.%03dZ, epoch %d." % (g.r.randint(1, 12), g.r.randint(1, 28), g.r.randint(0, 23), g.r.randint(0, 59), g.r.randint(0, 59), g.r.randint(0, 999), 1700000000 + g.r.randint(0, 99999999)),
    lambda g: "commit %s, sha256 %s" % (g.rs(40, "0123456789abcdef"), g.rs(64, "0123456789abcdef")),
    lambda g: "request id %s-%s-4%s-%s%s-%s" % (g.rs(8, "0123456789abcdef"), g.rs(4, "0123456789abcdef"), g.rs(3, "0123456789abcdef"), g.pick("89ab"), g.rs(3, "0123456789abcdef"), g.rs(12, "0123456789abcdef")),
    lambda g: "Tracking 1Z%s, parcel %s." % (g.rs(16, "0123456789ABCDEFGHJKLMNPRSTUVWXYZ"), g.digits(12)),
    lambda g: "The key point is that the token budget and the password policy are documented.",
    lambda g: "We met at the office at %d and talked about the release." % g.r.randint(1, 12),
    lambda g: "La riunione è alle %d:%02d, sala %d, piano %d." % (g.r.randint(8, 18), g.r.randint(0, 59), g.r.randint(1, 20), g.r.randint(0, 9)),
    lambda g: "Die Sitzung beginnt um %d Uhr in Raum %d; Aktenzeichen %s/%d." % (g.r.randint(8, 18), g.r.randint(100, 999), g.digits(5), g.r.randint(2019, 2025)),
    lambda g: "Le colis %s arrive le %02d/%02d, référence %s." % (g.digits(10), g.r.randint(1, 28), g.r.randint(1, 12), g.digits(8)),
    lambda g: "El pedido %s sale el %d de mayo, lote %s." % (g.digits(9), g.r.randint(1, 28), g.digits(6)),
    lambda g: "ISBN 978-%d-%s-%s-%d, page %d." % (g.r.randint(0, 9), g.digits(3), g.digits(5), g.r.randint(0, 9), g.r.randint(1, 400)),
    lambda g: "Coordinates %d.%06d, %d.%06d; altitude %d m." % (g.r.randint(1, 89), g.r.randint(0, 999999), g.r.randint(1, 179), g.r.randint(0, 999999), g.r.randint(0, 4000)),
    lambda g: "Python %d.%d.%d, numpy %d.%d.%d, CUDA %d.%d." % (3, g.r.randint(7, 13), g.r.randint(0, 20), 1, g.r.randint(20, 26), g.r.randint(0, 9), g.r.randint(10, 12), g.r.randint(0, 9)),
    lambda g: "Mario Kart and Rome are not people in this sentence; the Giro d'Italia starts in May.",
    lambda g: "Temperature %d.%d °C, pressure %d hPa, wind %d km/h." % (g.r.randint(-5, 35), g.r.randint(0, 9), g.r.randint(980, 1040), g.r.randint(0, 90)),
]


def make_item(g, idx):
    lang = g.pick(["en", "en", "it", "it", "fr", "de", "es"])
    parts = []
    for _ in range(g.r.randint(1, 3)):
        if g.r.random() < 0.5:
            parts.append(g.pick(NEAR)(g))
        typ = g.pick(["EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "US_SSN", "IT_FISCAL_CODE", "IP_ADDRESS", "SECRET", "URL_CREDENTIALS", "PERSON"])
        tmpl = g.pick(T[lang])
        pre = ""
        evade = g.r.random() < 0.45
        if typ == "EMAIL":
            local, dom = g.email(lang)
            ev, v = email_evasion(g.r, local, dom) if evade else ("plain", local + "@" + dom)
            if evade and g.r.random() < 0.15:
                ev, v = encode_evasion(g.r, local + "@" + dom)
            if g.r.random() < 0.1 and ev == "plain":
                pre = g.pick(["user=", "email=", "https://crm.example.com/contacts/", "mailto:"])
            body = lab("EMAIL", v, ev)
        elif typ == "PHONE":
            kind, v = g.phone()
            ev = "plain" if kind != "it_mobile_bare" else "bare_mobile"
            if kind not in ("it_mobile_bare",) and g.r.random() < 0.3:
                pre = CTX["PHONE"][lang]
            if kind == "it_mobile_intl" and g.r.random() < 0.25:
                pre, ev = g.pick(["phone=", "tel=", "cell:", "mobile="]), "kv_equals"
            elif evade and kind.startswith("it") and g.r.random() < 0.5:
                compact = v.replace(" ", "")
                ev, v = numeric_evasion(g.r, compact)
                if ev == "unicode_digits":
                    ev, v = "spaced", " ".join(compact)
            body = lab("PHONE", v, ev)
        elif typ == "CREDIT_CARD":
            d = g.card()
            if evade:
                ev, v = numeric_evasion(g.r, d)
                if g.r.random() < 0.1:
                    ev, v = encode_evasion(g.r, d)
            else:
                ev, v = "plain", g.pick([d, g.group_card(d), g.group_card(d, "-")])
            body = lab("CREDIT_CARD", v, ev)
        elif typ == "IBAN":
            d = g.iban()
            if evade:
                k = g.r.randrange(5)
                if k == 0:
                    ev, v = "lowercase", g.pick([d.lower(), g.paper(d).lower()])
                elif k == 1:
                    ev, v = "unicode_digits", unicode_digits(g.r, g.paper(d))
                elif k == 2:
                    ev, v = encode_evasion(g.r, d)
                else:
                    ev, v = numeric_evasion(g.r, d)
            else:
                ev, v = "plain", g.pick([d, g.paper(d)])
            body = lab("IBAN", v, ev)
        elif typ == "US_SSN":
            s = g.ssn()
            if evade:
                k = g.r.randrange(3)
                if k == 0:
                    ev, v = "ssn_bare", s
                    pre = g.pick(["SSN ", "SSN: ", "social security number ", "SSN#", "Social Security No. "])
                elif k == 1:
                    ev, v = "ssn_dots", s[:3] + "." + s[3:5] + "." + s[5:]
                else:
                    ev, v = numeric_evasion(g.r, s)
                    if ev == "unicode_digits":
                        ev, v = "ssn_dots", s[:3] + "." + s[3:5] + "." + s[5:]
            else:
                ev, v = "plain", g.pick([s[:3] + "-" + s[3:5] + "-" + s[5:], s[:3] + " " + s[3:5] + " " + s[5:]])
            body = lab("US_SSN", v, ev)
        elif typ == "IT_FISCAL_CODE":
            v = g.fiscal()
            ev = "plain"
            if evade and g.r.random() < 0.5:
                ev, v = "lowercase", v.lower()
            body = lab("IT_FISCAL_CODE", v, ev)
        elif typ == "IP_ADDRESS":
            body = lab("IP_ADDRESS", g.ip())
            pre = g.pick(["", "", "server ", "host ", "IP "])
        elif typ == "SECRET":
            s = g.secret()
            ev = "plain"
            if evade and "\n" not in s and g.r.random() < 0.4:
                ev, s = encode_evasion(g.r, s)
            body = lab("SECRET", s, ev)
            pre = g.pick(["", "", "key: ", "token=", "OPENAI_API_KEY="]) if ev == "plain" else ""
        elif typ == "URL_CREDENTIALS":
            user = g.pick(["admin", "app", "mario", "svc_ro", "deploy"])
            pw = g.rs(12) + g.pick(["", "!", "#x"])
            body = g.pick(["postgres", "mysql", "https", "redis", "amqp"]) + "://" + lab("URL_CREDENTIALS", user + ":" + pw) + "@" + g.pick(["db", "cache", "mq"]) + ".example.com:5432/app"
        else:  # PERSON
            name = g.person(lang)
            pre = g.pick(CTX["PERSON_PRE"][lang])
            body = lab("PERSON", name, "context")
        parts.append(tmpl.replace("{v}", pre + body))
    return {"id": "gen-%d" % idx, "lang": lang, "text": " ".join(parts)}


def split_item(g, idx):
    """A value split across two user turns with an assistant turn between."""
    typ = g.pick(["IBAN", "CREDIT_CARD", "EMAIL"])
    if typ == "IBAN":
        v = g.paper(g.iban())
    elif typ == "CREDIT_CARD":
        v = g.group_card(g.card())
    else:
        l, d = g.email("en")
        v = l + "@" + d
    cut = g.r.randrange(5, len(v) - 4)
    while v[cut - 1] == " " or v[cut] == " ":
        cut += 1
    a, b = v[:cut], v[cut:]
    ev = "split_turns#%d" % idx
    return {"id": "split-%d" % idx, "lang": "en", "segments": [
        "You are a helpful assistant.",
        g.pick(["My account is ", "Here it is: ", "The number: ", "Il mio dato: "]) + lab(typ, a, ev),
        g.pick(["Sure, go on.", "Please continue.", "Ok, and the rest?", "Capito, continua."]),
        lab(typ, b, ev) + g.pick([" - that's all.", "", " grazie", " thanks"]),
    ]}


def json_item(g, idx):
    d = g.card()
    l, dom = g.email("en")
    v = g.pick([('{"card": %s, "email": "%s", "notify": true}', "num"), ('{"amount": 12.5, "to": "%s", "pan": "%s"}', "str")])
    if v[1] == "num":
        text = '{"card": %s, "email": "%s", "notify": true}' % (lab("CREDIT_CARD", d, "json_number"), lab("EMAIL", l + "@" + dom))
    else:
        text = '{"amount": 12.5, "to": "%s", "pan": "%s"}' % (lab("EMAIL", l + "@" + dom), lab("CREDIT_CARD", g.group_card(d)))
    return {"id": "json-%d" % idx, "lang": "json", "text": text}


def main():
    seed = int(sys.argv[1])
    out = sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1200
    g = Gen(seed)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(make_item(g, i), ensure_ascii=False) + "\n")
        for i in range(n // 20):
            f.write(json.dumps(split_item(g, i), ensure_ascii=False) + "\n")
        for i in range(n // 20):
            f.write(json.dumps(json_item(g, i), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
