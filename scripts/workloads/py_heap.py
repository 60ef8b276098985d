"""Python workload for scripts/dump-workloads.sh: the in-memory state of a small web app.

Builds dicts of users and sessions, a request log of tuples, rendered page fragments, JSON
blobs and a word index until the process's resident set reaches the target, prints READY and
sleeps so its heap can be dumped. Usage: py_heap.py [TARGET_MIB]
"""

import json
import random
import sys
import time

FIRST = "alice bob carol dave erin frank grace heidi ivan judy mallory niaj olivia peggy rupert sybil trent victor walter yolanda".split()
LAST = "smith jones taylor brown williams wilson johnson davies robinson wright thompson evans walker white roberts green hall wood jackson clarke".split()
WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by word but not what all were we when your can said there use an each which she do how their if will up other about out many then them these so some her would make like him into time has look two more write go see number no way could people my than first water been call who oil its now find long down day did get come made may part").split()
DOMAINS = ["example.com", "mail.example.org", "corp.example.net", "uni.example.edu"]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36",
    "curl/8.8.0",
]
PATHS = ["/", "/login", "/logout", "/api/v1/items", "/api/v1/items/{id}", "/users/{id}", "/search", "/cart", "/checkout", "/static/app.js"]
TEMPLATE = """<div class="card" id="user-{id}">
  <h2>{name}</h2>
  <p class="email"><a href="mailto:{email}">{email}</a></p>
  <ul class="tags">{tags}</ul>
  <p class="bio">{bio}</p>
  <span class="balance">{balance:.2f}</span>
</div>
"""


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 // (1 << 20)


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_user(rng, uid):
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return {
        "id": uid,
        "name": f"{first.capitalize()} {last.capitalize()}",
        "email": f"{first}.{last}{uid}@{rng.choice(DOMAINS)}",
        "created": f"20{rng.randint(10, 24):02d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
        "age": rng.randint(18, 90),
        "balance": round(rng.uniform(-500, 10000), 2),
        "tags": [rng.choice(WORDS) for _ in range(rng.randint(0, 6))],
        "prefs": {"theme": rng.choice(["dark", "light"]), "lang": rng.choice(["en", "de", "fr", "ja"]), "notify": rng.random() < 0.5},
        "address": (rng.randint(1, 999), rng.choice(LAST).capitalize() + " Street", rng.choice(["Springfield", "Shelbyville", "Ogdenville"])),
        "bio": sentence(rng, rng.randint(3, 25)),
    }


def main():
    target = int(sys.argv[1]) if len(sys.argv) > 1 else 160
    rng = random.Random(20240611)
    users, sessions, log, pages, blobs, index = {}, {}, [], {}, [], {}
    uid = 0
    while rss_mib() < target:
        for _ in range(2000):
            uid += 1
            user = make_user(rng, uid)
            users[uid] = user
            for word in user["bio"].lower().rstrip(".").split():
                index.setdefault(word, []).append(uid)
            if rng.random() < 0.6:
                token = "%032x" % rng.getrandbits(128)
                ip = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
                sessions[token] = (uid, ip, 1718000000 + rng.randint(0, 10**6), rng.choice(AGENTS))
            for _ in range(rng.randint(1, 8)):
                path = rng.choice(PATHS).replace("{id}", str(rng.randint(1, uid)))
                log.append((1718000000 + len(log), rng.choice(["GET", "GET", "GET", "POST"]), path,
                            rng.choice([200, 200, 200, 301, 404, 500]), rng.expovariate(1 / 40.0), rng.randint(200, 90000)))
            if uid % 3 == 0:
                fields = dict(user, tags="".join(f"<li>{t}</li>" for t in user["tags"]))
                pages[f"/users/{uid}"] = TEMPLATE.format(**fields)
            if uid % 5 == 0:
                blobs.append(json.dumps(user, sort_keys=True))
        # Churn like a long-running server: expire some sessions and old log entries.
        if len(sessions) > 50000:
            for token in list(sessions)[: len(sessions) // 10]:
                del sessions[token]
        if len(log) > 400000:
            del log[: len(log) // 4]
    print("READY", uid, len(sessions), len(log), rss_mib(), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
