"""pg_ticket.django: invoices numbered gap-free under concurrent requests
with rollbacks, on a real server (django.test.Client in threads, each with
its own connection, as a threaded server has)."""

import random
import threading

import pytest

django = pytest.importorskip("django")
from django.conf import settings  # noqa: E402


@pytest.fixture(scope="module")
def django_db(registry, odd_schema_db):
    registry.fresh_db("py_django")
    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": "py_django",
                    "USER": "postgres",
                    "HOST": str(registry.dir),
                    "PORT": str(registry.port),
                },
                "odd_schema": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": odd_schema_db,
                    "USER": "postgres",
                    "HOST": str(registry.dir),
                    "PORT": str(registry.port),
                },
            },
            # contrib.auth's migrated tables are #47's conversion test.
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "djapp"],
            ROOT_URLCONF="djapp.views",
            ALLOWED_HOSTS=["testserver"],
            MIDDLEWARE=[],
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
            USE_TZ=True,
            # djapp/ids.py leases its machine id here.
            PG_TICKET_REGISTRY=registry.dsn,
        )
        django.setup()
    from django.db import connection

    from djapp.models import Event, Invoice, Shipment

    with connection.schema_editor() as editor:
        for model in [Invoice, Shipment, Event]:
            editor.create_model(model)
    yield
    connection.close()


def test_invoices_are_numbered_without_gaps_under_concurrent_requests(django_db):
    from django.db import connection
    from django.test import Client

    from djapp.models import Invoice

    answered = []
    lock = threading.Lock()

    def requests(seed):
        rng = random.Random(seed)
        client = Client()
        for _ in range(40):
            shop = rng.choice(["a", "b"])
            fail = rng.random() < 0.25
            reply = client.post(f"/shops/{shop}/invoices", {"fail": "1" if fail else "0"})
            with lock:
                answered.append((shop, fail, reply.status_code, reply.json()["number"] if reply.status_code == 200 else None))
        connection.close()  # this thread's connection

    threads = [threading.Thread(target=requests, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answered) == 320
    assert all(status == (409 if fail else 200) for _, fail, status, _ in answered)
    rolled_back = sum(fail for _, fail, _, _ in answered)
    assert rolled_back > 20, "the rollbacks are part of the test"
    for shop in ["a", "b"]:
        committed = sorted(number for s, _, status, number in answered if s == shop and status == 200)
        stored = sorted(Invoice.objects.filter(shop=shop).values_list("number", flat=True))
        assert stored == committed == list(range(1, len(committed) + 1)), f"shop {shop}: a gap or a number twice"


def test_the_helpers_refuse_the_wrong_transaction(django_db):
    from django.db import transaction

    from pg_ticket.django import next_scoped_id, reserve_block

    with pytest.raises(transaction.TransactionManagementError):
        next_scoped_id("shop-c", "invoice/2026")
    with transaction.atomic():
        assert next_scoped_id("shop-c", "invoice/2026") == 1
        with pytest.raises(transaction.TransactionManagementError):
            reserve_block("django-blocks", 10)
    assert reserve_block("django-blocks", 10) == (1, 10)
    assert reserve_block("django-blocks", 10) == (11, 20)
    # Autocommit turned off is a transaction too: a block reserved in it
    # could be rolled back and handed out again (found by review).
    transaction.set_autocommit(False)
    try:
        with pytest.raises(transaction.TransactionManagementError):
            reserve_block("django-blocks", 10)
        assert next_scoped_id("shop-c", "invoice/2026") == 2
        transaction.rollback()
        assert next_scoped_id("shop-c", "invoice/2026") == 2, "rolled back with the transaction"
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert reserve_block("django-blocks", 10) == (21, 30)


def test_the_helpers_call_the_extension_in_its_own_schema(django_db):
    """A schema name psycopg would misread ("%"), off the search_path, with
    decoys where a misread name or the search_path would lead."""
    from django.db import connections, transaction

    from pg_ticket.django import next_scoped_id, reserve_block

    with transaction.atomic(using="odd_schema"):
        assert [next_scoped_id("q", "d", using="odd_schema") for _ in range(3)] == [1, 2, 3]
    assert reserve_block("b", 5, using="odd_schema") == (1, 5)
    connections["odd_schema"].close()


def test_an_async_view_numbers_invoices_through_sync_to_async(django_db):
    """#48 item 7: an async view (AsyncClient) numbers gap-free through the
    ORM wrapped in sync_to_async, the transaction whole inside it."""
    import asyncio

    from django.test import AsyncClient

    from djapp.models import Invoice

    async def post_all():
        client = AsyncClient()
        return [(await client.post("/async/shops/async-17/invoices")).json()["number"] for _ in range(5)]

    numbers = asyncio.run(post_all())
    assert numbers == [1, 2, 3, 4, 5]
    assert sorted(Invoice.objects.filter(shop="async-17").values_list("number", flat=True)) == [1, 2, 3, 4, 5]


def test_next_ticket_and_a_transaction_on_another_alias_are_named(django_db):
    """#48 item 6: a next_ticket helper beside next_scoped_id; a call on the
    default alias inside atomic(using=...) of another says which alias holds
    the transaction."""
    from django.db import transaction

    from pg_ticket.django import next_scoped_id, next_ticket

    outside = next_ticket("dj-tickets", "jobs")
    with transaction.atomic():
        inside = next_ticket("dj-tickets", "jobs")
    assert inside > outside
    with transaction.atomic(using="odd_schema"):
        with pytest.raises(transaction.TransactionManagementError) as refused:
            next_scoped_id("dj-alias", "x")
    assert "using='odd_schema'" in str(refused.value), refused.value


def test_a_django_projects_migrated_tables_convert_to_tickets_and_back(django_db):
    """#47 item 3: contrib.auth's and contenttypes' tables as `migrate` made
    them (identity columns, rows the post-migrate signal inserted) converted
    with pgticket.convert_sequence: the ORM's inserts (RETURNING, many-to-many
    rows, foreign keys) go on, every new key above the old ones; an integer
    key refused as a snowflake; reverted, the identity hands out above the
    tickets."""
    from django.contrib.auth.models import Group, Permission, User
    from django.contrib.contenttypes.models import ContentType
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    User.objects.create_user("before", password="x")
    tables = ["auth_user", "auth_group", "auth_permission", "django_content_type", "auth_user_groups", "auth_group_permissions"]
    with connection.cursor() as cursor:
        top = {}
        for table in tables:
            cursor.execute(f"SELECT coalesce(max(id), 0) FROM {table}")
            top[table] = cursor.fetchone()[0]
        cursor.execute("SELECT attidentity FROM pg_attribute WHERE attrelid = 'auth_user'::regclass AND attname = 'id'")
        assert cursor.fetchone()[0] == "d", "Django made an identity column"
        with pytest.raises(Exception) as refused:
            cursor.execute("SELECT pgticket.convert_sequence('auth_user', 'id', 'snowflake')")
        assert getattr(refused.value.__cause__, "sqlstate", None) == "42804", refused.value
        for table in tables:
            cursor.execute("SELECT pgticket.convert_sequence(%s, 'id')", [table])
            assert cursor.fetchone()[0] >= top[table]
    assert top["auth_permission"] > 0 and top["django_content_type"] > 0, top

    users = [User.objects.create_user(f"after-{n}", password="x") for n in range(20)]
    group = Group.objects.create(name="staff")
    kind = ContentType.objects.create(app_label="shop", model="receipt")
    permission = Permission.objects.create(name="Can print", codename="print_receipt", content_type=kind)
    group.permissions.add(permission)
    for user in users:
        user.groups.add(group)
    keys = [u.pk for u in users]
    assert all(k > top["auth_user"] for k in keys) and len(set(keys)) == 20, keys
    assert keys == [User.objects.get(username=f"after-{n}").pk for n in range(20)], "RETURNING gave the row's key"
    assert group.pk > top["auth_group"] and kind.pk > top["django_content_type"] and permission.pk > top["auth_permission"]
    assert User.objects.filter(groups=group, groups__permissions=permission).count() == 20
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(id) FROM auth_user_groups")
        assert cursor.fetchone()[0] > top["auth_user_groups"]
        cursor.execute("SELECT pgticket.revert_conversion('auth_user', 'id')")
        cursor.execute("SELECT attidentity FROM pg_attribute WHERE attrelid = 'auth_user'::regclass AND attname = 'id'")
        assert cursor.fetchone()[0] == "d", "the identity is back"
    again = User.objects.create_user("reverted", password="x")
    assert again.pk > max(keys)


def test_snowflake_keys_made_in_the_process_and_by_the_database(django_db):
    """#48 (helper-9): the two snowflake keys docs/python.md shows. One
    generator per process, made at first use: a forked child leases a
    machine id of its own instead of stamping the parent's (the inherited
    one raises Forked); a key set by db_default is read back on save(), and
    bulk_create() stores it."""
    import os

    import pg_ticket
    from djapp import ids
    from djapp.models import Event, Shipment

    made = [Shipment.objects.create(carrier="dhl").id for _ in range(50)]
    assert made == sorted(made) and len(set(made)) == 50
    assert sorted(Shipment.objects.values_list("id", flat=True)) == made
    parent_machine = pg_ticket.decode(made[0], ids._generator.machine_bits, ids._generator.epoch_ms)[1]
    inherited = ids._generator
    read, write = os.pipe()
    # Forked while another thread holds the recipe's lock (helper-11: the
    # child waited on it for ever).
    ids._lock.acquire()
    child = os.fork()
    if child == 0:
        try:
            try:
                inherited.next_id()
                forked = "no"
            except pg_ticket.Forked:
                forked = "yes"
            os.write(write, f"{forked} {ids.next_id()} {ids._generator.machine_id}".encode())
        finally:
            os._exit(0)
    ids._lock.release()
    os.close(write)
    import select

    answered, _, _ = select.select([read], [], [], 60)
    if not answered:
        os.kill(child, 9)
    os.waitpid(child, 0)
    assert answered, "the child made its ID"
    with os.fdopen(read) as answer:
        forked, child_id, child_machine = answer.read().split()
    assert forked == "yes", "the parent's generator refuses in the child"
    assert int(child_machine) != parent_machine, "the child leased its own machine id"
    assert int(child_id) not in made

    one = Event.objects.create(kind="signup")
    assert isinstance(one.id, int) and one.id > made[0]
    # bulk_create() stores db_default keys but (Django 5.2) does not read a
    # primary key's back onto the objects, as docs/python.md says; keys
    # made in the process are on them before the insert.
    Event.objects.bulk_create([Event(kind="click") for _ in range(20)])
    assert Event.objects.values("id").distinct().count() == Event.objects.count() == 21
    batch = Shipment.objects.bulk_create([Shipment(carrier="ups") for _ in range(20)])
    keys = [s.id for s in batch]
    assert all(isinstance(k, int) for k in keys) and len(set(keys)) == 20
    assert set(Shipment.objects.filter(carrier="ups").values_list("id", flat=True)) == set(keys)
