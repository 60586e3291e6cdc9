"""Routes are declared once (control-plane/server/routes.py): the access table and the
OpenAPI paths come from the declarations, and an app with a route no declaration
covers refuses to start."""
import pytest
from flask import Flask

from corral.server import auth
from corral.server.routes import Routes, access_table, check_declared, openapi_paths, raw_routes, register

PARAM = {"name": "thing_id", "in": "path", "required": True, "schema": {"type": "string"}}


def things() -> Routes:
    routes = Routes("things")

    @routes.get("/things/<thing_id>", access=auth.READ, operation_id="getThing", summary="Read a thing.",
                responses={"200": {"description": "The thing."}})
    def read_thing(context, thing_id):
        return {"thing": thing_id, "context": context}

    @routes.put("/things/<thing_id>", access=auth.OPERATOR, raw=True, operation_id="putThing",
                summary="Store a thing.", tag="other", responses={"200": {"description": "Stored."}})
    def put_thing(context, thing_id):
        return {}

    return routes


def test_the_table_and_the_document_come_from_the_declarations():
    groups = [things()]
    assert access_table(groups) == {"read_thing": auth.READ, "put_thing": auth.OPERATOR}
    assert raw_routes(groups) == ("put_thing",)
    item = openapi_paths(groups, {"thing_id": PARAM})["/things/{thing_id}"]
    assert item["parameters"] == [PARAM]
    assert item["get"]["operationId"] == "getThing" and item["get"]["tags"] == ["things"]
    assert item["put"]["tags"] == ["other"]


def test_handlers_get_the_context_and_keep_their_endpoint_names():
    app = Flask(__name__)
    register(app, [things()], "the context")
    assert {rule.endpoint for rule in app.url_map.iter_rules()} >= {"read_thing", "put_thing"}
    assert app.test_client().get("/things/t1").json == {"thing": "t1", "context": "the context"}


def test_a_declaration_needs_an_access_rule():
    with pytest.raises(TypeError):
        Routes("things").get("/x", operation_id="x", summary="x", responses={})  # type: ignore[call-arg]


def test_an_app_with_an_undeclared_route_refuses_to_start():
    app = Flask(__name__, static_folder=None)
    groups = [things()]
    register(app, groups, None)
    check_declared(app, access_table(groups))

    @app.get("/behind-its-back")
    def behind_its_back():
        return {}

    with pytest.raises(RuntimeError, match="behind-its-back"):
        check_declared(app, access_table(groups))


def test_an_endpoint_declared_twice_is_refused():
    with pytest.raises(ValueError, match="read_thing"):
        access_table([things(), things()])
