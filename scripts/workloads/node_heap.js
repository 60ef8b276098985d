// Node.js workload for scripts/dump-workloads.sh: the state of a small API server.
//
// Builds objects for products and orders, arrays of events, JSON-like trees (parsed and
// stringified), Maps of string keys and a text index until the resident set reaches the target,
// prints READY and stays alive so its heap can be dumped. Usage: node node_heap.js [TARGET_MIB]
'use strict';

const target = Number(process.argv[2] || 160);

// Small deterministic PRNG (mulberry32) so every run builds the same kind of data.
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

const ADJ = 'red blue green small large vintage modern wooden steel organic premium compact wireless portable classic'.split(' ');
const NOUN = 'chair table lamp phone cable mug shirt shoe backpack bottle keyboard monitor speaker jacket watch'.split(' ');
const WORDS = 'lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip ex ea commodo consequat'.split(' ');
const CITIES = ['Berlin', 'Lisbon', 'Osaka', 'Toronto', 'Nairobi', 'Lima', 'Oslo', 'Perth'];
const STATUS = ['pending', 'paid', 'shipped', 'delivered', 'cancelled', 'refunded'];

const text = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');

class Order {
  constructor(id, customer, items, total, status, createdAt) {
    this.id = id;
    this.customer = customer;
    this.items = items;
    this.total = total;
    this.status = status;
    this.createdAt = createdAt;
  }
}

const products = new Map();
const skus = [];
const customers = [];
const orders = [];
const events = [];
const responseCache = new Map();
const index = Object.create(null);

function rssMib() {
  return process.memoryUsage().rss / (1 << 20);
}

let nextId = 1;
function grow() {
  for (let k = 0; k < 1000; k++) {
    const id = nextId++;
    const sku = `SKU-${(id * 7919).toString(36).toUpperCase()}`;
    const product = {
      sku,
      title: `${pick(ADJ)} ${pick(ADJ)} ${pick(NOUN)}`,
      price: Math.round(rand() * 50000) / 100,
      stock: int(0, 500),
      description: text(int(5, 40)),
      attributes: { color: pick(ADJ), weightGrams: int(50, 5000), tags: [pick(ADJ), pick(NOUN)] },
      ratings: Array.from({ length: int(0, 12) }, () => int(1, 5)),
    };
    products.set(sku, product);
    skus.push(sku);
    for (const word of product.description.split(' ')) (index[word] ||= []).push(sku);

    if (id % 4 === 0) {
      customers.push({
        id: customers.length + 1,
        name: `${pick(WORDS)} ${pick(WORDS)}`,
        email: `user${id}@example.com`,
        address: { street: `${int(1, 300)} ${pick(WORDS)} road`, city: pick(CITIES), zip: String(int(10000, 99999)) },
        since: new Date(1.6e12 + int(0, 1e11)).toISOString(),
      });
    }
    if (customers.length > 0) {
      const items = Array.from({ length: int(1, 5) }, () => ({ sku: skus[int(Math.max(0, skus.length - 50), skus.length - 1)], qty: int(1, 4) }));
      const total = items.reduce((sum, it) => sum + products.get(it.sku).price * it.qty, 0);
      orders.push(new Order(id, pick(customers).id, items, Math.round(total * 100) / 100, pick(STATUS), Date.now() - int(0, 1e9)));
    }
    events.push([Date.now(), pick(['view', 'click', 'add_to_cart', 'purchase']), sku, int(0, 1e6)]);
    if (id % 3 === 0) {
      // A JSON-like tree that went through the wire: stringified and parsed back.
      const body = JSON.stringify({ product, related: skus.slice(-5), meta: { v: 2, city: pick(CITIES) } });
      responseCache.set(`/api/products/${sku}`, body);
      if (id % 6 === 0) responseCache.set(`/api/products/${sku}?parsed`, JSON.parse(body));
    }
  }
  if (events.length > 300000) events.splice(0, 100000);
}

while (rssMib() < target) grow();
console.log(`READY ${products.size} ${orders.length} ${Math.round(rssMib())}`);
setInterval(() => {}, 1 << 30);
