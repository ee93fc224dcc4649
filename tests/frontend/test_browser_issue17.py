"""Issue 17 in a real browser (headless Debian Chromium, see conftest.py): no page scrolls sideways at 1440 or
800 px, dark mode keeps body text readable (WCAG AA, measured from the computed colours), and the header's
search finds a claim, a node and a device by UUID."""
import pytest

from claims.services.claims import create_claims
from frontend import demo as demo_mod
from inventory.models import Device, Node
from tests.frontend.conftest import login
from tests.gangs.conftest import rack_fleet  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A selector with a long unbroken literal: the Spec box must wrap it, not widen the page.
LONG_CEL = ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA-H100-80GB-HBM3-' + "X" * 160 + '" || '
            + " || ".join(f'device.attributes["gpu.nvidia.com"].index == {i}' for i in range(12)))

CONTRAST_JS = """([sel]) => {
  function rgb(s) { const m = s.match(/[\\d.]+/g).map(Number);
                    return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; }
  function lum(c) { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); }
  function bg(el) { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
                      if (c.a > 0) return c; } return {r: 255, g: 255, b: 255, a: 1}; }
  const el = document.querySelector(sel);
  const fg = rgb(getComputedStyle(el).color), back = bg(el);
  const [hi, lo] = [lum(fg), lum(back)].sort((a, b) => b - a);
  return {ratio: (hi + 0.05) / (lo + 0.05), bg: getComputedStyle(document.body).backgroundColor};
}"""

# Tables wider than the card they sit in (they would scroll inside it): data-testid or header of each.
TABLES_CUT_JS = """() => [...document.querySelectorAll('.card table')].filter(t => {
  const card = t.closest('.card'); return t.getBoundingClientRect().right > card.getBoundingClientRect().right + 1;
}).map(t => t.dataset.testid || t.querySelector('th, td').innerText)"""

# What sticks out past the window's right edge (for the failure message).
WIDEST_JS = """() => { const out = []; const W = window.innerWidth;
  for (const e of document.querySelectorAll('main *, header *')) { const d = e.style.display; e.style.display = 'none';
    const sw = document.documentElement.scrollWidth; e.style.display = d;
    if (sw <= W) out.push(e.tagName + '.' + e.className + '#' + (e.dataset.testid || '')); }
  return out.slice(-6); }"""


def pages(demo) -> list[str]:
    mig_cluster, mig_node = demo["mig_node"]
    lab_cluster, lab_node = demo["lab_node"]
    d = Device.objects.filter(cluster__name=mig_cluster, node_name=mig_node).exclude(consumes_counters=[]) \
        .select_related("cluster").first()
    gpu = f"{d.cluster.name}/{d.driver}/{d.pool_name}/{d.consumes_counters[0]['counterSet']}"
    key = f"{d.cluster.name}/{d.driver}/{d.pool_name}/{d.name}"
    device = f"{d.cluster.name}/devices/{d.driver}/{d.pool_name}/{d.name}"
    return [
        "/", "/utilisation/", "/clusters/", "/clusters/aws-us-east-1/", f"/clusters/{mig_cluster}/nodes/{mig_node}/",
        f"/clusters/{lab_cluster}/nodes/{lab_node}/", f"/clusters/{device}/", "/sharing/", "/fragmentation/",
        "/claims/", "/claims/?phase=Pending", "/claims/ci/long-cel/", "/claims/ci/b200-job/",
        "/claims/research/mig-pair/", "/inventory/slices/", "/inventory/pools/", "/inventory/deviceclasses/",
        "/inventory/deviceclasses/gpu.nvidia.com/", "/inventory/taintrules/",
        "/inventory/try-selector/?expression=" + 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"',
        "/search/?q=ci/", f"/history/nodes/{mig_cluster}/{mig_node}/", f"/history/devices/{key}/",
        f"/history/gpus/{gpu}/", "/gangs/", "/queues/",
    ]


def test_no_page_scrolls_sideways_at_1440_or_800_px(page, live_server, people, demo):
    create_claims("ci", [demo_mod.claim("long-cel", [demo_mod.request("gpu", demo_mod.GPU, 1, [LONG_CEL])])])
    login(page, live_server, "viewer")
    wide, cut = [], []
    for width in (1440, 800):
        page.set_viewport_size({"width": width, "height": 900})
        for url in pages(demo):
            resp = page.goto(live_server.url + url)
            assert resp.status == 200, url
            sizes = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            if sizes[0] > sizes[1]:
                wide.append((width, url, sizes))
            if width == 1440:  # on a desktop screen no table is cut off at its card's edge either
                cut.extend((url, t) for t in page.evaluate(TABLES_CUT_JS))
        # The long CEL expression wraps inside the Spec box: no scroll bar there either.
        page.goto(live_server.url + "/claims/ci/long-cel/")
        spec = page.get_by_test_id("spec-yaml")
        assert "X" * 40 in spec.inner_text()
        assert spec.evaluate("e => e.scrollWidth <= e.clientWidth"), width
    assert not wide, wide
    assert not cut, cut


def test_dark_mode_follows_the_system_and_the_toggle_keeps_text_readable(browser, live_server, people, demo):
    context = browser.new_context(viewport={"width": 1366, "height": 800}, color_scheme="light")
    page = context.new_page()
    try:
        login(page, live_server, "viewer")
        page.goto(live_server.url + "/claims/")
        light = page.evaluate(CONTRAST_JS, ["body"])
        page.emulate_media(color_scheme="dark")  # the system setting changes: the page follows it
        dark = page.evaluate(CONTRAST_JS, ["body"])
        assert light["bg"] != dark["bg"]
        for checked in ("body", ".page-head .sub", "table.t td", ".card"):
            for scheme in ("light", "dark"):
                page.emulate_media(color_scheme=scheme)
                ratio = page.evaluate(CONTRAST_JS, [checked])["ratio"]
                assert ratio >= 4.5, (checked, scheme, ratio)
        # The toggle pins the other theme and remembers it across pages.
        page.emulate_media(color_scheme="light")
        page.get_by_test_id("theme-toggle").click()
        assert page.evaluate("document.documentElement.dataset.theme") == "dark"
        page.goto(live_server.url + "/")
        assert page.evaluate(CONTRAST_JS, ["body"])["bg"] == dark["bg"]
        assert page.evaluate("localStorage.getItem('draservice-theme')") == "dark"
        page.get_by_test_id("theme-toggle").click()
        assert page.evaluate(CONTRAST_JS, ["body"])["bg"] == light["bg"]
    finally:
        context.close()


def test_search_from_the_header(page, live_server, people, demo):
    login(page, live_server, "viewer")
    box = page.get_by_test_id("search-box")
    box.fill("ci/b200-job")
    box.press("Enter")
    page.get_by_test_id("result-claims").get_by_role("link", name="ci/b200-job").click()
    assert page.url.endswith("/claims/ci/b200-job/")

    node = Node.objects.select_related("cluster").order_by("name").first()
    page.get_by_test_id("search-box").fill(node.name)
    page.get_by_test_id("search-box").press("Enter")
    page.get_by_test_id("result-nodes").get_by_role("link", name=node.name, exact=True).click()
    assert page.url.endswith(f"/clusters/{node.cluster.name}/nodes/{node.name}/")

    dev = Device.objects.filter(attribute_index__has_key="gpu.nvidia.com/uuid").first()
    uuid = dev.attribute_index["gpu.nvidia.com/uuid"]
    page.get_by_test_id("search-box").fill(uuid)
    page.get_by_test_id("search-box").press("Enter")
    results = page.get_by_test_id("result-devices")
    assert uuid in results.inner_text()
    results.get_by_role("link", name=dev.name, exact=True).first.click()
    assert f"/devices/{dev.driver}/{dev.pool_name}/{dev.name}/" in page.url


def test_gang_topology_keeps_member_names_whole(page, live_server, people, rack_fleet):  # noqa: F811
    from gangs.services import gangs as gang_services
    from tests.gangs import fleet as gang_fleet
    from tests.gangs.conftest import NS

    gang_services.create_gang(NS, gang_fleet.gang_body("train", 4))
    gang_services.create_gang(NS, gang_fleet.gang_body("big", 5))
    login(page, live_server, "viewer")
    for width in (1440, 800):
        page.set_viewport_size({"width": width, "height": 900})
        for url in (f"/gangs/{NS}/train/", f"/gangs/{NS}/big/"):
            page.goto(live_server.url + url)
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (
                width, url, page.evaluate(WIDEST_JS))
        page.goto(live_server.url + f"/gangs/{NS}/train/")
        names = page.locator(".who-name")
        assert names.count() >= 4
        # Each name on one line, nothing hidden: as wide as its text and one line high.
        for i in range(names.count()):
            ok = names.nth(i).evaluate("""e => e.scrollWidth <= e.clientWidth + 1
                && e.getBoundingClientRect().height < 1.6 * parseFloat(getComputedStyle(e).lineHeight)
                && e.closest('.topo-node').getBoundingClientRect().right >= e.getBoundingClientRect().right""")
            assert ok, names.nth(i).inner_text()
