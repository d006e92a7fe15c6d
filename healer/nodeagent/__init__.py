"""The node agent (``healer agent``): carries out the controller's signed repair requests on its own node."""
