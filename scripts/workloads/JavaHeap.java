// Java workload for scripts/dump-workloads.sh: the caches of a small service.
//
// Fills HashMaps and ArrayLists with records, strings, boxed numbers and a TreeMap index until
// the used heap reaches the target, prints READY and sleeps so its memory can be dumped.
// Compiled with javac at run time. Usage: java JavaHeap [TARGET_MIB]

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;

public class JavaHeap {
    record Address(String street, String city, int zip) {}

    record Account(long id, String login, String displayName, String email, Address address,
                   List<String> roles, Map<String, String> settings, double balance, long createdAt) {}

    record AuditEvent(long timestamp, long accountId, String action, String resource, int status, Integer latencyMs) {}

    static final String[] WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
            + "pi rho sigma tau upsilon phi chi psi omega invoice ledger account order shipment refund customer").split(" ");
    static final String[] CITIES = {"Amsterdam", "Bogota", "Cairo", "Dublin", "Helsinki", "Kyoto", "Madrid", "Quito"};
    static final String[] ROLES = {"admin", "editor", "viewer", "billing", "support", "auditor"};
    static final String[] ACTIONS = {"LOGIN", "LOGOUT", "READ", "UPDATE", "DELETE", "EXPORT"};

    public static void main(String[] args) throws InterruptedException {
        long targetMib = args.length > 0 ? Long.parseLong(args[0]) : 160;
        Random rng = new Random(424242);
        Map<Long, Account> accounts = new HashMap<>();
        Map<String, Long> byLogin = new HashMap<>();
        List<AuditEvent> audit = new ArrayList<>();
        TreeMap<String, List<Long>> index = new TreeMap<>();
        Map<String, String> rendered = new HashMap<>();
        Runtime rt = Runtime.getRuntime();
        long id = 0;
        while ((rt.totalMemory() - rt.freeMemory()) >> 20 < targetMib) {
            for (int k = 0; k < 2000; k++) {
                id++;
                String first = WORDS[rng.nextInt(WORDS.length)];
                String last = WORDS[rng.nextInt(WORDS.length)];
                String login = first + "." + last + id;
                List<String> roles = new ArrayList<>();
                for (int r = rng.nextInt(3); r >= 0; r--) roles.add(ROLES[rng.nextInt(ROLES.length)]);
                Map<String, String> settings = new HashMap<>();
                settings.put("locale", rng.nextBoolean() ? "en_US" : "de_DE");
                settings.put("timezone", "UTC+" + rng.nextInt(12));
                if (rng.nextInt(4) == 0) settings.put("signature", "Regards, " + first + " " + last);
                Account a = new Account(id, login, capitalize(first) + " " + capitalize(last),
                        login + "@example.com",
                        new Address(rng.nextInt(999) + " " + capitalize(WORDS[rng.nextInt(WORDS.length)]) + " Ave",
                                CITIES[rng.nextInt(CITIES.length)], 10000 + rng.nextInt(89999)),
                        roles, settings, Math.round(rng.nextGaussian() * 100000) / 100.0,
                        1_600_000_000_000L + (long) (rng.nextDouble() * 1e11));
                accounts.put(id, a);
                byLogin.put(login, id);
                index.computeIfAbsent(last, w -> new ArrayList<>()).add(id);
                for (int e = rng.nextInt(6); e >= 0; e--) {
                    audit.add(new AuditEvent(System.currentTimeMillis(), id, ACTIONS[rng.nextInt(ACTIONS.length)],
                            "/api/v2/" + WORDS[rng.nextInt(WORDS.length)] + "/" + rng.nextInt(100000),
                            rng.nextInt(10) == 0 ? 500 : 200, rng.nextInt(250)));
                }
                if (id % 4 == 0) rendered.put("/accounts/" + id, a.toString());
            }
            if (audit.size() > 1_000_000) audit.subList(0, 250_000).clear();
        }
        System.out.println("READY " + accounts.size() + " " + audit.size() + " "
                + ((rt.totalMemory() - rt.freeMemory()) >> 20));
        System.out.flush();
        while (true) Thread.sleep(3_600_000);
    }

    static String capitalize(String s) {
        return Character.toUpperCase(s.charAt(0)) + s.substring(1);
    }
}
